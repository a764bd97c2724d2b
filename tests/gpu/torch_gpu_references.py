#!/usr/bin/env python3
"""PyTorch-on-the-GPU references for tests/gpu/test_torch_gpu_parity.cu.

Runs each model's PyTorch twin (benchmarks/reference/torch_models.py, named as the C++ headers name
their layers) on CUDA device 0 in float32, with TF32 off in cuBLAS and cuDNN, for one forward and
backward pass of the mean cross-entropy on a seeded batch, and writes under --out DIR one
model_<name>.safetensors per model: "state.<name>" the state_dict before the pass (PyTorch's
default initialisation, seeded; num_batches_tracked as I64), "input", "labels" (I32), "loss" (F64
scalar), "output" (the logits), "grad.<param>" and, for models with BatchNorm in training mode,
"after.<buffer>" (the running statistics after the pass). Metadata "config": {"mode", "batch"}.

Exits with status 77 (CTest: skipped), saying why, when PyTorch is missing or sees no CUDA device.
"""

import argparse
import json
import pathlib
import sys
import time

SKIP = 77

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as error:
    print(f"skipped: PyTorch is not installed ({error})")
    sys.exit(SKIP)

HERE = pathlib.Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1] / "parity"))
sys.path.insert(0, str(HERE.parents[2] / "benchmarks" / "reference"))
import safetensors_io  # noqa: E402  (tests/parity/safetensors_io.py)
from torch_models import MODELS  # noqa: E402

# name, mode, batch: MnistConvNet in eval mode (its dropout masks cannot be reproduced), the others
# in training mode (BatchNorm on batch statistics).
CASES = [("mlp", "train", 64), ("mnist_convnet", "eval", 32), ("cifar_net", "train", 32),
         ("resnet20", "train", 64)]


def host(t):
    return t.detach().cpu().contiguous().numpy().copy()


def state_tensors(module, prefix):
    return {prefix + name: host(t) for name, t in module.state_dict().items()}


def write_case(out_dir, index, name, mode, batch, device):
    factory, sample = MODELS[name]
    torch.manual_seed(5000 + index)
    model = factory()
    model.train(mode == "train")
    tensors = state_tensors(model, "state.")
    model = model.to(device)
    generator = torch.Generator().manual_seed(6000 + index)
    x = torch.randn((batch,) + sample, generator=generator)
    labels = torch.randint(0, 10, (batch,), generator=generator)
    out = model(x.to(device))
    loss = F.cross_entropy(out, labels.to(device))
    loss.backward()
    tensors["input"] = host(x)
    tensors["labels"] = labels.numpy().astype(np.int32)
    tensors["loss"] = np.array(loss.item(), dtype=np.float64)
    tensors["output"] = host(out)
    for pname, p in model.named_parameters():
        tensors["grad." + pname] = host(p.grad)
    tensors.update({"after." + n: host(b) for n, b in model.named_buffers()})
    safetensors_io.save(out_dir / f"model_{name}.safetensors", tensors,
                        {"config": json.dumps({"mode": mode, "batch": batch})})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=pathlib.Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"skipped: PyTorch {torch.__version__} sees no CUDA device")
        sys.exit(SKIP)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    device = torch.device("cuda", 0)
    for index, (name, mode, batch) in enumerate(CASES):
        write_case(args.out, index, name, mode, batch, device)
    print(f"torch_gpu_references.py: PyTorch {torch.__version__} on {torch.cuda.get_device_name(0)}, "
          f"wrote {args.out} in {time.monotonic() - start:.1f} s")


if __name__ == "__main__":
    main()
