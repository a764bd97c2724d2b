#!/usr/bin/env python3
"""PyTorch references for coltrain's DistributedSampler without shuffling.

Writes --out DIR/sampler.safetensors: for every case, the I64 tensor
"n<N>_r<R>_drop<0|1>_rank<r>" holding list(torch.utils.data.DistributedSampler(range(N),
num_replicas=R, rank=r, shuffle=False, drop_last=...)). (Shuffled orders come from torch's
generator, which coltrain does not reproduce, so only the unshuffled lists are compared.)
"""

import argparse
import pathlib
import sys

import numpy as np
from torch.utils.data import DistributedSampler

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "parity"))
import safetensors_io  # noqa: E402  (tests/parity/safetensors_io.py)

SIZES = [0, 1, 2, 3, 5, 8, 10, 17, 33]
REPLICAS = [1, 2, 3, 4, 5, 7]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    out = pathlib.Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for n in SIZES:
        for replicas in REPLICAS:
            for drop_last in (False, True):
                for rank in range(replicas):
                    sampler = DistributedSampler(range(n), num_replicas=replicas, rank=rank,
                                                 shuffle=False, drop_last=drop_last)
                    name = f"n{n}_r{replicas}_drop{int(drop_last)}_rank{rank}"
                    tensors[name] = np.array(list(sampler), dtype=np.int64)
                    assert len(tensors[name]) == len(sampler)
    safetensors_io.save(out / "sampler.safetensors", tensors)


if __name__ == "__main__":
    main()
