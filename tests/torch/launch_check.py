#!/usr/bin/env python3
"""coltrain_torch.init_process_group() under any launcher coltrain knows: with none of torchrun's
variables (mpiexec, srun) the ranks come from the launcher's own, as coltrain reads them; with
Kubeflow's (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, no LOCAL_RANK) they are used as they are.
Each rank checks an allreduce and prints one line; a wrong result or a failed start exits non-zero.

    launch_check.py [--expect-launcher-variables]   (fail if RANK was set: mpiexec and srun)"""
import os
import sys

import torch
import torch.distributed as dist

import coltrain_torch

if "--expect-launcher-variables" in sys.argv:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        assert name not in os.environ, f"{name} is set: this check is for other launchers"
coltrain_torch.init_process_group()
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
assert t.item() == world * (world + 1) / 2, f"rank {rank}: allreduce gave {t.item()}"
print(f"rank {rank} of {world} (local rank {os.environ['LOCAL_RANK']}, launcher "
      f"{coltrain_torch.launch_env()['world_size']} ranks): allreduce exact", flush=True)
dist.destroy_process_group()
