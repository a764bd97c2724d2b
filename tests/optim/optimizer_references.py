#!/usr/bin/env python3
"""PyTorch references for coltrain's optimizers and learning-rate schedules.

Writes under --out DIR, as safetensors:
  <case>.safetensors   one optimizer run: the initial parameters ("initial.<param>"), the gradient
                       fed at each step ("grad.<k>.<param>"), torch's parameters after each step
                       ("value.<k>.<param>"), the learning rate torch's scheduler set for each step
                       ("lr", F64), and the final optimizer state under coltrain's names
                       ("state.<param>.momentum_buffer", ".exp_avg", ".exp_avg_sq", ".step").
                       Metadata "config" is JSON: optimizer, options, schedule, steps, params.
  schedules.safetensors  longer runs of torch's LR schedulers, one F64 tensor per schedule, with
                       metadata "config" mapping each name to its JSON description.

The optimizers run torch.optim's single-tensor path (foreach=False), which is the one coltrain's
loops follow. Parameters with "weight_decay": false sit in a param group with weight_decay 0.
"""

import argparse
import json
import pathlib
import sys
import warnings

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "parity"))
import safetensors_io  # noqa: E402  (tests/parity/safetensors_io.py)

STEPS = 10
# Two parameters whose sizes are not multiples of the vector width, so that torch's vectorised
# kernels and their scalar tails both run; the bias is exempt from weight decay.
PARAMS = [("layer.weight", (4, 9), True), ("layer.bias", (7,), False)]


def make_scheduler(optimizer, spec):
    kind = spec["type"]
    sched = torch.optim.lr_scheduler
    if kind == "constant":
        return sched.ConstantLR(optimizer, factor=spec["factor"], total_iters=spec["total_iters"])
    if kind == "step":
        return sched.StepLR(optimizer, step_size=spec["step_size"], gamma=spec["gamma"])
    if kind == "multi_step":
        return sched.MultiStepLR(optimizer, milestones=spec["milestones"], gamma=spec["gamma"])
    if kind == "cosine":
        return sched.CosineAnnealingLR(optimizer, T_max=spec["t_max"], eta_min=spec["eta_min"])
    if kind == "warmup":
        # coltrain's LinearWarmup is defined as this SequentialLR.
        warmup = sched.LinearLR(optimizer, start_factor=spec["start_factor"], end_factor=1.0,
                                total_iters=spec["warmup_steps"])
        inner = make_scheduler(optimizer, spec["inner"])
        return sched.SequentialLR(optimizer, [warmup, inner], milestones=[spec["warmup_steps"]])
    raise ValueError(f"unknown schedule {kind}")


def with_base_lr(spec, base_lr):
    """The schedule's JSON for C++, where every closed form carries its base rate."""
    spec = dict(spec)
    if spec["type"] == "warmup":
        spec["inner"] = with_base_lr(spec["inner"], base_lr)
    else:
        spec["base_lr"] = base_lr
    return spec


def make_optimizer(kind, groups, options):
    if kind == "sgd":
        return torch.optim.SGD(groups, lr=options["lr"], momentum=options["momentum"],
                               dampening=options["dampening"],
                               weight_decay=options["weight_decay"],
                               nesterov=options["nesterov"], foreach=False)
    betas = (options["beta1"], options["beta2"])
    cls = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
    return cls(groups, lr=options["lr"], betas=betas, eps=options["eps"],
               weight_decay=options["weight_decay"], foreach=False)


def sgd(lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
    return ("sgd", dict(lr=lr, momentum=momentum, dampening=dampening,
                        weight_decay=weight_decay, nesterov=nesterov))


def adam(kind, lr, weight_decay, beta1=0.9, beta2=0.999, eps=1e-8):
    return (kind, dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay))


WARMUP_STEP = {"type": "warmup", "warmup_steps": 4, "start_factor": 0.25,
               "inner": {"type": "step", "step_size": 3, "gamma": 0.5}}
WARMUP_COSINE = {"type": "warmup", "warmup_steps": 3, "start_factor": 0.1,
                 "inner": {"type": "cosine", "t_max": 7, "eta_min": 1e-4}}

CASES = {
    "sgd_plain": (sgd(0.1), {"type": "step", "step_size": 3, "gamma": 0.5}),
    "sgd_weight_decay": (sgd(0.1, weight_decay=0.05),
                         {"type": "constant", "factor": 0.5, "total_iters": 3}),
    "sgd_momentum": (sgd(0.05, momentum=0.9),
                     {"type": "multi_step", "milestones": [2, 5, 5], "gamma": 0.3}),
    "sgd_dampening": (sgd(0.05, momentum=0.9, dampening=0.3, weight_decay=1e-3),
                      {"type": "cosine", "t_max": 6, "eta_min": 1e-3}),
    "sgd_nesterov": (sgd(0.05, momentum=0.8, weight_decay=1e-2, nesterov=True), WARMUP_STEP),
    "adam": (adam("adam", 1e-2, 0.0), {"type": "cosine", "t_max": 10, "eta_min": 0.0}),
    "adam_l2": (adam("adam", 2e-2, 0.1, beta1=0.8, beta2=0.99, eps=1e-6),
                {"type": "step", "step_size": 4, "gamma": 0.5}),
    "adamw": (adam("adamw", 1e-2, 1e-2), WARMUP_COSINE),
    "adamw_strong_decay": (adam("adamw", 5e-2, 0.5),
                           {"type": "multi_step", "milestones": [3, 7], "gamma": 0.2}),
    "adamw_no_decay": (adam("adamw", 1e-2, 0.0),
                       {"type": "constant", "factor": 1.0, "total_iters": 0}),
}

SCHEDULES = {
    "constant": {"type": "constant", "factor": 1.0 / 3.0, "total_iters": 5},
    "step": {"type": "step", "step_size": 7, "gamma": 0.1},
    "multi_step": {"type": "multi_step", "milestones": [10, 25, 25, 31], "gamma": 0.5},
    "cosine": {"type": "cosine", "t_max": 15, "eta_min": 0.002},
    "cosine_to_zero": {"type": "cosine", "t_max": 12, "eta_min": 0.0},
    "warmup_step": WARMUP_STEP,
    "warmup_cosine": WARMUP_COSINE,
    "warmup_multi_step": {"type": "warmup", "warmup_steps": 5, "start_factor": 0.125,
                          "inner": {"type": "multi_step", "milestones": [10, 20], "gamma": 0.1}},
}
SCHEDULE_STEPS = 40
SCHEDULE_BASE_LR = 0.4


def run_case(kind, options, schedule, generator):
    params = [torch.nn.Parameter(torch.randn(shape, generator=generator) * 0.5)
              for _, shape, _ in PARAMS]
    tensors = {f"initial.{n}": p.detach().numpy().copy() for (n, _, _), p in zip(PARAMS, params)}
    groups = [{"params": [p]} if decay else {"params": [p], "weight_decay": 0.0}
              for p, (_, _, decay) in zip(params, PARAMS)]
    optimizer = make_optimizer(kind, groups, options)
    scheduler = make_scheduler(optimizer, schedule)
    lrs = []
    for k in range(STEPS):
        lrs.append(optimizer.param_groups[0]["lr"])
        assert all(g["lr"] == lrs[-1] for g in optimizer.param_groups)
        for (n, shape, _), p in zip(PARAMS, params):
            # Gradients whose scale varies from step to step, 1e-3 to 1.
            p.grad = torch.randn(shape, generator=generator) * float(10.0 ** ((k % 4) - 3))
            tensors[f"grad.{k}.{n}"] = p.grad.numpy().copy()
        optimizer.step()
        scheduler.step()
        for (n, _, _), p in zip(PARAMS, params):
            tensors[f"value.{k}.{n}"] = p.detach().numpy().copy()
    tensors["lr"] = np.array(lrs, dtype=np.float64)
    for (n, _, _), p in zip(PARAMS, params):
        for key, value in optimizer.state[p].items():
            if key == "momentum_buffer" and value is None:
                continue
            tensors[f"state.{n}.{key}"] = value.detach().numpy().astype(np.float32).copy()
    config = {
        "optimizer": kind,
        "options": options,
        "schedule": with_base_lr(schedule, options["lr"]),
        "steps": STEPS,
        "params": [{"name": n, "weight_decay": decay} for n, _, decay in PARAMS],
    }
    return tensors, {"config": json.dumps(config)}


def run_schedules():
    tensors, configs = {}, {}
    for name, spec in SCHEDULES.items():
        param = torch.nn.Parameter(torch.zeros(1))
        optimizer = torch.optim.SGD([param], lr=SCHEDULE_BASE_LR)
        scheduler = make_scheduler(optimizer, spec)
        values = []
        for _ in range(SCHEDULE_STEPS):
            values.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        tensors[name] = np.array(values, dtype=np.float64)
        configs[name] = with_base_lr(spec, SCHEDULE_BASE_LR)
    return tensors, {"config": json.dumps(configs)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=pathlib.Path)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)

    # SequentialLR calls scheduler.step(0), which PyTorch 1.13 flags as deprecated; it is the
    # documented behaviour being referenced here.
    warnings.filterwarnings("ignore", category=UserWarning)

    generator = torch.Generator().manual_seed(20221028)
    for name, ((kind, options), schedule) in CASES.items():
        tensors, metadata = run_case(kind, options, schedule, generator)
        safetensors_io.save(str(args.out / f"{name}.safetensors"), tensors, metadata)
    tensors, metadata = run_schedules()
    safetensors_io.save(str(args.out / "schedules.safetensors"), tensors, metadata)
    print(f"wrote {len(CASES) + 1} reference files to {args.out}")


if __name__ == "__main__":
    main()
