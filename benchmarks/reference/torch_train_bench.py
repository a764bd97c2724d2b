#!/usr/bin/python3
"""The PyTorch side of the training benchmark: the same models, batch, threads, synthetic data and
step (forward, cross-entropy, backward, SGD with momentum) as build/benchmarks/train_bench, with the
same output line and CSV columns. Run with Debian's python3-torch (CPU)."""

import argparse
import csv
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_backends import describe, keep_freed_memory  # noqa: E402
from torch_models import MODELS  # noqa: E402


def measure(name, batch, threads, seconds):
    constructor, sample_shape = MODELS[name]
    torch.manual_seed(0)
    model = constructor()
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images = torch.rand((batch,) + sample_shape)
    labels = torch.randint(0, 10, (batch,))

    def step():
        optimizer.zero_grad(set_to_none=False)
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()

    for _ in range(3):  # warm-up: allocator, oneDNN primitive caches
        step()
    steps = 0
    start = time.perf_counter()
    while True:
        step()
        steps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
    return steps * batch / elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="mlp,mnist_convnet,cifar_net,resnet20")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--csv")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    print(f"reference: {describe()}", flush=True)
    rows = []
    for name in args.model.split(","):
        if name not in MODELS:
            parser.error(f"unknown model '{name}'; known: {', '.join(MODELS)}")
        rate = measure(name, args.batch, args.threads, args.seconds)
        print(f"{name:<14} batch {args.batch:>4}  threads {args.threads}  fp32  cpu   "
              f"{rate:10.1f} images/s  (pytorch {torch.__version__})", flush=True)
        rows.append([name, args.batch, args.threads, "fp32", "cpu", f"{rate:.2f}", ""])
    if args.csv:
        with open(args.csv, "w", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(["model", "batch", "threads", "precision", "device", "images_per_s", "gflops"])
            writer.writerows(rows)


if __name__ == "__main__":
    main()
