#!/usr/bin/env python3
"""coltrain_torch.init_process_group() under a launcher that sets none of torchrun's variables
(mpiexec, srun): the ranks come from the launcher's own, as coltrain reads them. Each rank checks
an allreduce and prints one line; the test passes on every rank's line."""
import os

import torch
import torch.distributed as dist

import coltrain_torch

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
