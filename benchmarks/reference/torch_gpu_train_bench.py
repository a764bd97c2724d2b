#!/usr/bin/env python3
"""The PyTorch side of the GPU training benchmark: the same models, batch, synthetic data and step
(forward, cross-entropy, backward, SGD with momentum 0.9) as build/benchmarks/gpu_train_bench, in
PyTorch eager mode with automatic mixed precision (autocast fp16 + GradScaler, or bf16 without a
scaler; with --precision fp32 neither, on PyTorch's defaults: TF32 in cuDNN's convolutions) and
channels-last memory format, cuDNN autotuning on: the configuration the issue names as
the reference. Prints one line per model and round; --csv writes the median per model."""

import argparse
import csv
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import MODELS  # noqa: E402


def measure(name, batch, precision, steps, rounds):
    constructor, sample_shape = MODELS[name]
    torch.manual_seed(0)
    device = torch.device("cuda")
    model = constructor().to(device).to(memory_format=torch.channels_last)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images = torch.rand((batch,) + sample_shape, device=device).to(
        memory_format=torch.channels_last)
    labels = torch.randint(0, 10, (batch,), device=device)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": None}[precision]
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")

    def step():
        optimizer.zero_grad(set_to_none=False)
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = F.cross_entropy(model(images), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    for _ in range(20):  # warm-up: cuDNN autotuning, allocator, kernels' first launches
        step()
    torch.cuda.synchronize()
    rates = []
    for _ in range(rounds):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            step()
        stop.record()
        stop.synchronize()
        seconds = start.elapsed_time(stop) / 1e3
        rates.append(steps * batch / seconds)
    return rates


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="mnist_convnet,resnet20")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--precision", default="fp16", choices=["fp32", "fp16", "bf16"])
    parser.add_argument("--steps", type=int, default=50, help="steps per timed round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--csv")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    rows = []
    for name in args.model.split(","):
        if name not in MODELS:
            parser.error(f"unknown model '{name}'; known: {', '.join(MODELS)}")
        rates = measure(name, args.batch, args.precision, args.steps, args.rounds)
        mode = "eager" if args.precision == "fp32" else "eager, amp"
        for index, rate in enumerate(rates):
            print(f"{name:<14} batch {args.batch:>4}  {args.precision}  cuda  round {index}  "
                  f"{rate:10.1f} images/s  (pytorch {torch.__version__} {mode}, channels-last)",
                  flush=True)
        median = statistics.median(rates)
        print(f"{name:<14} median {median:10.1f} images/s", flush=True)
        rows.append([name, args.batch, 1, args.precision, "cuda", f"{median:.2f}", ""])
    if args.csv:
        with open(args.csv, "w", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(["model", "batch", "threads", "precision", "device", "images_per_s",
                             "gflops"])
            writer.writerows(rows)


if __name__ == "__main__":
    main()
