#!/usr/bin/env python3
"""PyTorch references for coltrain's layers and models (tests/nn/test_layer_parity.cpp).

Writes under --out DIR, as safetensors (float32 unless noted):

  layer_<case>.safetensors   one layer, wrapped as `Probe.layer` so that its state_dict names are
      "layer.<name>" as in the C++ network Sequential<Input, GradProbe, Named<"layer", Spec>>:
      "state.<name>"   the state_dict before the step (parameters and buffers; num_batches_tracked I64)
      "input", "grad_output" (r), "output" (layer(input)), "grad_input" and "grad.<param>", the
      gradients of sum(r * output); "after.<buffer>" the buffers after the forward (BatchNorm's
      running statistics). Metadata "config": {"mode": "train" | "eval"}.
  loss_<case>.safetensors    softmax cross-entropy: "logits", "labels" (I32), "loss" (F64 scalar),
      "grad_logits"; metadata "config": {"label_smoothing": e}.
  model_<name>.safetensors   a model's PyTorch twin, trained for STEPS steps of SGD (lr 0.05,
      momentum 0.9, written out by hand: buf = grad at the first step, then buf = 0.9 buf + grad;
      p -= 0.05 buf) on the mean cross-entropy: "state.<name>" the initial state_dict (PyTorch's
      default initialisation, seeded), "input.<k>", "labels.<k>" (I32) and "loss.<k>" (F64 scalar)
      for every step k, "output.0" and "grad.0.<param>" (the first step's logits and gradients),
      "final.<name>" the state_dict after the last step. Metadata "config": {"mode", "lr",
      "momentum", "steps", "batch"}. model_resnet{20,32,56}_double.safetensors: the same in float64.
  names.safetensors          metadata "models": JSON {model: {"parameters": [[name, shape]...],
      "buffers": [...], "state_dict": [...]}} in PyTorch's order, for every model coltrain ships.

The twins follow the model headers in include/coltrain/models/ (attribute names included).
MnistConvNet runs in eval mode (its dropout layers are the identity; torch's random masks cannot be
reproduced); the other models train in training mode (ResNet-20's BatchNorm uses batch statistics).
"""

import argparse
import json
import pathlib
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "parity"))
import safetensors_io  # noqa: E402  (tests/parity/safetensors_io.py)

STEPS = 5
LR = 0.05
MOMENTUM = 0.9


def numpy(t):
    """A copy: .numpy() shares the tensor's memory, which training then changes in place."""
    return t.detach().cpu().contiguous().numpy().copy()


# ---------------------------------------------------------------------------------------------
# Model twins: the ones the training benchmark uses (benchmarks/reference/torch_models.py), named as
# the C++ headers name their layers.

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "reference"))
from torch_models import MODELS, BasicBlock  # noqa: E402


# ---------------------------------------------------------------------------------------------
# Layers

class Probe(nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return self.layer(x)


def randomize_batch_norms(module, generator):
    """Non-trivial BatchNorm parameters and statistics, so that gamma = 1, beta = 0 hide nothing."""
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.weight.uniform_(0.5, 1.5, generator=generator)
                m.bias.uniform_(-0.5, 0.5, generator=generator)
                m.running_mean.uniform_(-0.3, 0.3, generator=generator)
                m.running_var.uniform_(0.5, 2.0, generator=generator)


LAYER_CASES = [
    # name, module factory, input shape (with batch), mode
    ("linear", lambda: nn.Linear(20, 7), (5, 20), "train"),
    ("linear_nobias", lambda: nn.Linear(20, 7, bias=False), (5, 20), "train"),
    ("conv_k3_s1_p1", lambda: nn.Conv2d(3, 8, 3, 1, 1), (4, 3, 9, 9), "train"),
    ("conv_k3_s2_p1_nobias", lambda: nn.Conv2d(4, 6, 3, 2, 1, bias=False), (3, 4, 10, 10), "train"),
    ("conv_k1_s2", lambda: nn.Conv2d(5, 4, 1, 2, 0), (3, 5, 7, 7), "train"),
    ("conv_k3_s1_p0_packed", lambda: nn.Conv2d(2, 5, 3), (37, 2, 6, 6), "train"),
    ("conv_winograd_p1", lambda: nn.Conv2d(16, 16, 3, 1, 1), (6, 16, 8, 8), "train"),
    ("conv_winograd_p0_nobias", lambda: nn.Conv2d(16, 24, 3, bias=False), (3, 16, 10, 10), "train"),
    ("maxpool_k3_s2_p1", lambda: nn.MaxPool2d(3, 2, 1), (3, 4, 9, 9), "train"),
    ("maxpool_k2", lambda: nn.MaxPool2d(2), (2, 3, 8, 7), "train"),
    ("avgpool_k3_s2_p1", lambda: nn.AvgPool2d(3, 2, 1), (3, 4, 9, 9), "train"),
    ("avgpool_k2", lambda: nn.AvgPool2d(2), (2, 3, 8, 7), "train"),
    ("global_avgpool", lambda: nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten()), (3, 6, 5, 5),
     "train"),
    ("batchnorm_train", lambda: nn.BatchNorm2d(6), (5, 6, 7, 7), "train"),
    ("batchnorm_eval", lambda: nn.BatchNorm2d(6), (5, 6, 7, 7), "eval"),
    ("relu", lambda: nn.ReLU(), (4, 50), "train"),
    ("flatten_linear", lambda: nn.Sequential(nn.Flatten(), nn.Linear(48, 5)), (3, 3, 4, 4), "train"),
    ("block_identity", lambda: BasicBlock(8, 8, 1), (4, 8, 8, 8), "train"),
    ("block_projection", lambda: BasicBlock(8, 16, 2), (4, 8, 8, 8), "train"),
    ("block_projection_eval", lambda: BasicBlock(8, 16, 2), (4, 8, 8, 8), "eval"),
]


def state_tensors(module, prefix):
    return {prefix + name: numpy(t) for name, t in module.state_dict().items()}


def write_layer_case(out_dir, index, name, factory, shape, mode):
    generator = torch.Generator().manual_seed(1000 + index)
    torch.manual_seed(2000 + index)
    model = Probe(factory())
    randomize_batch_norms(model, generator)
    model.train(mode == "train")
    tensors = state_tensors(model, "state.")
    x = torch.randn(shape, generator=generator).requires_grad_()
    r = torch.randn(model(x.detach()).shape, generator=generator)
    # The probing forward above moved BatchNorm's statistics: start again from the saved state.
    model.load_state_dict({k[len("state."):]: torch.from_numpy(v) for k, v in tensors.items()})
    y = model(x)
    (y * r).sum().backward()
    tensors.update({"input": numpy(x), "grad_output": numpy(r), "output": numpy(y),
                    "grad_input": numpy(x.grad)})
    for pname, p in model.named_parameters():
        tensors["grad." + pname] = numpy(p.grad)
    for bname, b in model.named_buffers():
        tensors["after." + bname] = numpy(b)
    safetensors_io.save(out_dir / f"layer_{name}.safetensors", tensors,
                        {"config": json.dumps({"mode": mode})})


def write_loss_case(out_dir, name, smoothing):
    generator = torch.Generator().manual_seed(77)
    logits = (3 * torch.randn(8, 10, generator=generator)).requires_grad_()
    labels = torch.randint(0, 10, (8,), generator=generator)
    loss = F.cross_entropy(logits.double(), labels, label_smoothing=smoothing)
    loss.backward()
    safetensors_io.save(out_dir / f"loss_{name}.safetensors",
                        {"logits": numpy(logits), "labels": labels.numpy().astype(np.int32),
                         "loss": np.array(loss.item(), dtype=np.float64),
                         "grad_logits": numpy(logits.grad).astype(np.float32)},
                        {"config": json.dumps({"label_smoothing": smoothing})})


# ---------------------------------------------------------------------------------------------
# Models: a few SGD steps

# name, mode, batch, dtype. ResNet-20 also runs in float64: in float32 its run is chaotic (see
# test_model_parity.cpp), in float64 the whole run can be compared tightly; ResNet-32 and ResNet-56
# run in float64 alone. New cases go last: the index seeds each case.
TRAINED = [("mlp", "train", 16, torch.float32), ("mnist_convnet", "eval", 8, torch.float32),
           ("cifar_net", "train", 8, torch.float32), ("resnet20", "train", 8, torch.float32),
           ("resnet20", "train", 4, torch.float64), ("resnet32", "train", 4, torch.float64),
           ("resnet56", "train", 4, torch.float64)]


def write_model_case(out_dir, index, name, mode, batch, dtype):
    factory, sample = MODELS[name]
    torch.manual_seed(3000 + index)
    model = factory().to(dtype)
    model.train(mode == "train")
    generator = torch.Generator().manual_seed(4000 + index)
    tensors = state_tensors(model, "state.")
    momentum = {}
    for step in range(STEPS):
        x = torch.randn((batch,) + sample, generator=generator).to(dtype)
        labels = torch.randint(0, 10, (batch,), generator=generator)
        model.zero_grad(set_to_none=True)
        out = model(x)
        loss = F.cross_entropy(out, labels)
        loss.backward()
        tensors[f"input.{step}"] = numpy(x)
        tensors[f"labels.{step}"] = labels.numpy().astype(np.int32)
        tensors[f"loss.{step}"] = np.array(loss.item(), dtype=np.float64)
        if step == 0:
            tensors["output.0"] = numpy(out)
            for pname, p in model.named_parameters():
                tensors["grad.0." + pname] = numpy(p.grad)
        with torch.no_grad():
            for pname, p in model.named_parameters():
                buf = momentum.get(pname)
                buf = p.grad.clone() if buf is None else buf.mul_(MOMENTUM).add_(p.grad)
                momentum[pname] = buf
                p.add_(buf, alpha=-LR)
    tensors.update(state_tensors(model, "final."))
    config = {"mode": mode, "lr": LR, "momentum": MOMENTUM, "steps": STEPS, "batch": batch}
    suffix = "_double" if dtype == torch.float64 else ""
    safetensors_io.save(out_dir / f"model_{name}{suffix}.safetensors", tensors,
                        {"config": json.dumps(config)})


def write_names(out_dir):
    models = {}
    for name, (factory, _) in MODELS.items():
        model = factory()
        models[name] = {
            "parameters": [[n, list(p.shape)] for n, p in model.named_parameters()],
            "buffers": [[n, list(b.shape)] for n, b in model.named_buffers()],
            "state_dict": [[n, list(t.shape)] for n, t in model.state_dict().items()],
            "parameter_count": sum(p.numel() for p in model.parameters()),
        }
    safetensors_io.save(out_dir / "names.safetensors", {"unused": np.zeros(1, dtype=np.float32)},
                        {"models": json.dumps(models)})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=pathlib.Path)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    # One thread: quick enough (a few seconds), and immune to the slowdown of spinning threads on a
    # busy machine (ctest runs suites side by side).
    torch.set_num_threads(1)
    start = time.monotonic()
    for index, (name, factory, shape, mode) in enumerate(LAYER_CASES):
        write_layer_case(args.out, index, name, factory, shape, mode)
    write_loss_case(args.out, "plain", 0.0)
    write_loss_case(args.out, "smoothed", 0.1)
    for index, (name, mode, batch, dtype) in enumerate(TRAINED):
        write_model_case(args.out, index, name, mode, batch, dtype)
    write_names(args.out)
    print(f"layer_references.py: wrote {args.out} in {time.monotonic() - start:.1f} s")


if __name__ == "__main__":
    main()
