#!/usr/bin/env python3
"""PyTorch references for coltrain's float64 training (tests/optim/test_float64_training_parity.cpp).

Writes --out DIR/mnist_convnet_float64.safetensors, all float64 but the labels:
  "state.<name>"     MnistConvNet's initial state_dict (PyTorch's default initialisation, seeded)
  "input.<b>"        batch b of the POOL batches, "labels.<b>" (I32) its labels; step k trains on
                     batch k % POOL: the loss falls (from 2.3 to 1.1-1.8) but stays far from 0,
                     where log(1 + tiny) would cost the loss its relative precision
  "loss.<case>"      the mean cross-entropy of every step (before that step's update) of one run
                     from the initial state through torch.optim (single-tensor path, foreach=False)
Metadata "config": JSON {"steps", "batch", "pool", "cases": {case: {"optimizer", hyperparameters}}};
the C++ builds its optimizers from these hyperparameters.

The model runs in eval mode: its dropout layers are the identity (torch's random masks cannot be
reproduced); it has no BatchNorm, so eval mode changes nothing else. Every parameter sits in one
param group, weight decay included, as coltrain's parameters_of hands them over.
"""

import argparse
import json
import pathlib
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "parity"))
import safetensors_io  # noqa: E402  (tests/parity/safetensors_io.py)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "reference"))
from torch_models import MODELS  # noqa: E402

STEPS = 100
BATCH = 8
POOL = 16
CASES = {
    "sgd_nesterov": {"optimizer": "sgd", "lr": 0.01, "momentum": 0.9, "dampening": 0.0,
                     "weight_decay": 5e-4, "nesterov": True},
    "adam": {"optimizer": "adam", "lr": 2e-4, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
             "weight_decay": 1e-4},
    "adamw": {"optimizer": "adamw", "lr": 2e-4, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
              "weight_decay": 1e-2},
}


def numpy(t):
    """A copy: .numpy() shares the tensor's memory, which training then changes in place."""
    return t.detach().cpu().contiguous().numpy().copy()


def make_optimizer(params, spec):
    if spec["optimizer"] == "sgd":
        return torch.optim.SGD(params, lr=spec["lr"], momentum=spec["momentum"],
                               dampening=spec["dampening"], weight_decay=spec["weight_decay"],
                               nesterov=spec["nesterov"], foreach=False)
    cls = torch.optim.Adam if spec["optimizer"] == "adam" else torch.optim.AdamW
    return cls(params, lr=spec["lr"], betas=(spec["beta1"], spec["beta2"]), eps=spec["eps"],
               weight_decay=spec["weight_decay"], foreach=False)


def train(initial_state, batches, spec):
    factory, _ = MODELS["mnist_convnet"]
    model = factory().to(torch.float64)
    model.load_state_dict(initial_state)
    model.eval()
    optimizer = make_optimizer(model.parameters(), spec)
    losses = []
    for step in range(STEPS):
        x, labels = batches[step % POOL]
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return np.array(losses, dtype=np.float64)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=pathlib.Path)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    # One thread: the same sums on every machine, and no spinning threads on a busy one.
    torch.set_num_threads(1)
    start = time.monotonic()

    factory, sample = MODELS["mnist_convnet"]
    torch.manual_seed(4400)
    initial_state = {k: v.clone() for k, v in factory().to(torch.float64).state_dict().items()}
    generator = torch.Generator().manual_seed(4401)
    batches = [(torch.randn((BATCH,) + sample, generator=generator, dtype=torch.float64),
                torch.randint(0, 10, (BATCH,), generator=generator)) for _ in range(POOL)]

    tensors = {"state." + name: numpy(t) for name, t in initial_state.items()}
    for b, (x, labels) in enumerate(batches):
        tensors[f"input.{b}"] = numpy(x)
        tensors[f"labels.{b}"] = labels.numpy().astype(np.int32)
    for case, spec in CASES.items():
        tensors["loss." + case] = train(initial_state, batches, spec)
    config = {"steps": STEPS, "batch": BATCH, "pool": POOL, "cases": CASES}
    safetensors_io.save(args.out / "mnist_convnet_float64.safetensors", tensors,
                        {"config": json.dumps(config)})
    print(f"float64_training_references.py: wrote {args.out} in {time.monotonic() - start:.1f} s")


if __name__ == "__main__":
    main()
