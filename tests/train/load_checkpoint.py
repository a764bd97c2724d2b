#!/usr/bin/python3
"""Loads checkpoints that coltrain wrote (train_fixture_writer checkpoints DIR) into the PyTorch
twins of benchmarks/reference/torch_models.py and checks them:

  * the weights file loads with load_state_dict(strict=True), in the dtypes it was saved in (F32,
    BF16 parameters, I64 num_batches_tracked), every value exactly;
  * the optimizer file holds PyTorch's state names for the recorded optimizer (momentum_buffer,
    exp_avg, exp_avg_sq) with the parameters' shapes, and, under mixed precision, fp32 master
    weights that round to the stored bf16 weights;
  * for fp32 checkpoints, the PyTorch model's evaluation-mode output on the fixed input coltrain
    used matches coltrain's logits to 1e-5, relative to the largest logit.

The safetensors files are read by tests/parity/safetensors_io.py (struct, json and numpy; no
safetensors package). Without PyTorch or numpy the script prints "skipped: ..." and exits with 77,
which CTest reports as skipped.

    load_checkpoint.py --dir DIR
"""

import argparse
import json
import sys
from pathlib import Path

SKIP_RETURN_CODE = 77
ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-5

STATE_NAMES = {"SGD": ["momentum_buffer"], "Adam": ["exp_avg", "exp_avg_sq"],
               "AdamW": ["exp_avg", "exp_avg_sq"]}


class CheckFailed(Exception):
    pass


def check(condition, message):
    if not condition:
        raise CheckFailed(message)


def latest_sidecar(case_dir):
    """The newest checkpoint-NNNNNN.json whose files exist with the recorded sizes."""
    for sidecar_path in sorted(case_dir.glob("checkpoint-*.json"), reverse=True):
        sidecar = json.loads(sidecar_path.read_text())
        files = sidecar["files"]
        if all((case_dir / files[k]["name"]).is_file() and
               (case_dir / files[k]["name"]).stat().st_size == files[k]["bytes"]
               for k in ("model", "optimizer")):
            return sidecar_path, sidecar
    raise CheckFailed(f"{case_dir}: no complete checkpoint")


def check_case(case_dir, np, torch, safetensors_io, torch_models):
    sidecar_path, sidecar = latest_sidecar(case_dir)
    check(sidecar["format"] == "coltrain.checkpoint", f"{sidecar_path}: not a coltrain sidecar")
    model_file = case_dir / sidecar["files"]["model"]["name"]
    optimizer_file = case_dir / sidecar["files"]["optimizer"]["name"]
    storage = sidecar["model"]["storage"]

    # The weights, as stored: BF16 kept as bits and reinterpreted, not widened.
    raw = safetensors_io.load(model_file, bf16="raw")
    state = {}
    for name, value in raw.items():
        if isinstance(value, safetensors_io.BFloat16):
            state[name] = torch.from_numpy(value.bits.view(np.int16)).view(torch.bfloat16)
        else:
            state[name] = torch.from_numpy(value)

    constructor, _ = torch_models.MODELS[sidecar["model"]["name"]]
    model = constructor()
    parameter_dtype = {"F32": torch.float32, "BF16": torch.bfloat16}[storage]
    model = model.to(parameter_dtype)
    for name, parameter in model.named_parameters():
        check(name in state, f"{model_file}: no tensor '{name}'")
        check(state[name].dtype == parameter_dtype,
              f"{model_file}: '{name}' is {state[name].dtype}, expected {parameter_dtype}")
    for name, buffer in model.named_buffers():
        expected = torch.int64 if name.endswith("num_batches_tracked") else torch.float32
        check(state[name].dtype == expected,
              f"{model_file}: '{name}' is {state[name].dtype}, expected {expected}")
    count = sum(p.numel() for p in model.parameters())
    check(count == sidecar["model"]["parameter_count"],
          f"{sidecar_path}: parameter count {sidecar['model']['parameter_count']}, PyTorch's "
          f"model has {count}")

    model.load_state_dict(state, strict=True)
    for name, value in model.state_dict().items():
        loaded = value.to(state[name].dtype)
        check(torch.equal(loaded, state[name]), f"{model_file}: '{name}' changed on loading")

    # The optimizer's state under PyTorch's names and the parameters' shapes.
    optimizer_state = safetensors_io.load(optimizer_file)
    parameters = dict(model.named_parameters())
    suffixes = list(STATE_NAMES[sidecar["optimizer"]["type"]])
    if sidecar["precision"] != "fp32":
        suffixes.append("master_weight")
    expected_names = {f"{p}.{s}" for p in parameters for s in suffixes}
    check(set(optimizer_state) == expected_names,
          f"{optimizer_file}: tensors {sorted(set(optimizer_state) ^ expected_names)} differ "
          "from the expected state names")
    for name, value in optimizer_state.items():
        parameter = parameters[name.rsplit(".", 1)[0]]
        check(value.dtype == np.float32 and tuple(value.shape) == tuple(parameter.shape),
              f"{optimizer_file}: '{name}' is {value.dtype} {value.shape}, expected float32 "
              f"{tuple(parameter.shape)}")
        if name.endswith(".master_weight"):
            rounded = torch.from_numpy(value).to(parameter_dtype)
            check(torch.equal(rounded, parameter.detach()),
                  f"{optimizer_file}: '{name}' does not round to the stored weights")

    if storage != "F32":
        # 16-bit activations round differently in PyTorch's kernels: values only, no outputs.
        print(f"{case_dir.name}: {model_file.name} loads strictly ({len(state)} tensors, "
              f"{storage}); masters round to the weights")
        return
    outputs = safetensors_io.load(case_dir / "outputs.safetensors")
    model.eval()
    with torch.no_grad():
        actual = model(torch.from_numpy(outputs["input"])).numpy()
    expected = outputs["logits"]
    scale = max(float(np.abs(expected).max()), 1e-6)
    error = float(np.abs(actual.astype(np.float64) - expected).max()) / scale
    print(f"{case_dir.name}: {model_file.name} loads strictly ({len(state)} tensors); "
          f"eval logits max error {error:.2e} of the largest logit (tolerance {TOLERANCE:g})")
    check(error <= TOLERANCE, f"{case_dir.name}: PyTorch's logits differ from coltrain's by "
                              f"{error:.2e} of the largest (tolerance {TOLERANCE:g})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True, type=Path,
                        help="what 'train_fixture_writer checkpoints DIR' wrote")
    args = parser.parse_args()
    try:
        import numpy as np
        import torch
    except ImportError as error:
        print(f"skipped: {error.name} is not installed (Debian: python3-torch, python3-numpy)")
        return SKIP_RETURN_CODE
    sys.path.insert(0, str(ROOT / "tests" / "parity"))
    sys.path.insert(0, str(ROOT / "benchmarks" / "reference"))
    import safetensors_io
    import torch_models

    torch.manual_seed(0)  # the twins' own initialisation is overwritten; keep it deterministic
    cases = sorted(p for p in args.dir.iterdir() if p.is_dir())
    if not cases:
        print(f"load_checkpoint.py: no checkpoints under {args.dir}", file=sys.stderr)
        return 1
    try:
        for case in cases:
            check_case(case, np, torch, safetensors_io, torch_models)
    except CheckFailed as failure:
        print(f"load_checkpoint.py: {failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
