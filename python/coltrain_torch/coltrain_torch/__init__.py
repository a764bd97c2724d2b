"""coltrain's collectives as a torch.distributed backend.

Importing this package registers the backend "coltrain":

    import coltrain_torch  # noqa: F401  (registers the backend)
    torch.distributed.init_process_group("coltrain")

Ranks meet through the store init_process_group made (torchrun's, or env:// and tcp://), then talk
over coltrain's TCP transport, through shared memory between ranks of a host. coltrain's variables
apply: COLTRAIN_AUTH_TOKEN or COLTRAIN_AUTH_FILE (a secret every connection proves),
COLTRAIN_TIMEOUT (else init_process_group's timeout), COLTRAIN_SOCKET_IFNAME. Under Slurm or mpiexec,
where torchrun's variables are not set, init_process_group() below fills them in from the
launcher's first.
"""
import os
from datetime import timedelta
from typing import Optional

import torch.distributed as dist

from . import _coltrain

__all__ = ["BACKEND", "launch_env", "init_process_group"]

BACKEND = "coltrain"

if not hasattr(dist.Backend, BACKEND.upper()):
    dist.Backend.register_backend(BACKEND, _coltrain.create_process_group)


def launch_env() -> dict:
    """Rank, world size, local rank and rendezvous address as coltrain reads them from the
    launcher (torchrun, Kubeflow's PyTorchJob, Slurm, mpiexec of MPICH or Open MPI)."""
    return _coltrain.launch_env()


def init_process_group(timeout: Optional[timedelta] = None, **kwargs) -> None:
    """torch.distributed.init_process_group("coltrain") under any launcher coltrain knows: sets
    RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT from the launcher's variables where
    they are missing, then initialises with env://. Other arguments go to init_process_group."""
    env = launch_env()
    defaults = {
        "RANK": env["rank"],
        "WORLD_SIZE": env["world_size"],
        "LOCAL_RANK": env["local_rank"],
        "MASTER_ADDR": env["master_addr"],
        "MASTER_PORT": env["master_port"],
    }
    for name, value in defaults.items():
        os.environ.setdefault(name, str(value))
    if timeout is not None:
        kwargs["timeout"] = timeout
    dist.init_process_group(BACKEND, init_method="env://", **kwargs)
