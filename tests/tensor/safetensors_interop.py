"""Half of tensor_io_python_tests: checks the file coltrain wrote, then writes files for coltrain.

    safetensors_interop.py CPP_FILE PY_FILE PY_BOOL_FILE

Reads CPP_FILE with tests/parity/safetensors_io.py and asserts its exact values (bit patterns for
floats, so signed zeros, infinities and subnormals count), then writes PY_FILE, whose values
test_safetensors_python.cpp asserts, and PY_BOOL_FILE, a BOOL tensor coltrain must reject. Exits
non-zero with the first mismatch.
"""

import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "parity"))
import safetensors_io  # noqa: E402


def check_bits(name, array, dtype, shape, view, expected_bits):
    assert array.dtype == np.dtype(dtype), f"{name}: dtype {array.dtype}, expected {dtype}"
    assert array.shape == shape, f"{name}: shape {array.shape}, expected {shape}"
    bits = array.view(view).reshape(-1).tolist()
    assert bits == expected_bits, f"{name}: bits {[hex(b) for b in bits]}"


def check_values(name, array, dtype, shape, expected):
    assert array.dtype == np.dtype(dtype), f"{name}: dtype {array.dtype}, expected {dtype}"
    assert array.shape == shape, f"{name}: shape {array.shape}, expected {shape}"
    values = array.reshape(-1).tolist()
    assert values == expected, f"{name}: values {values}, expected {expected}"


def check_cpp_file(path):
    tensors = safetensors_io.load(path)
    assert set(tensors) == {"f32", "f64", "f16", "bf16", "i32", "i64", "u8", "scalar",
                            "num_batches_tracked", "empty"}, sorted(tensors)
    assert safetensors_io.load_metadata(path) == {"format": "pt", "producer": "coltrain"}

    check_bits("f32", tensors["f32"], np.float32, (2, 4), np.uint32,
               [0x00000000, 0x80000000, 0x3FC00000, 0xC0100000, 0x7F7FFFFF, 0x7F800000,
                0x00000001, 0x3DCCCCCD])
    check_values("f64", tensors["f64"], np.float64, (3,), [0.1, -1e300, 5e-324])
    check_bits("f16", tensors["f16"], np.float16, (2, 3), np.uint16,
               [0x0000, 0x8000, 0x3C00, 0x7BFF, 0x0001, 0x7C00])
    bf16_bits = [0x0000, 0x8000, 0x3F80, 0x7F7F, 0x0001, 0xFF80]
    check_bits("bf16 as float32", tensors["bf16"], np.float32, (3, 2), np.uint32,
               [b << 16 for b in bf16_bits])
    raw = safetensors_io.load(path, bf16="raw")["bf16"]
    assert raw.bits.reshape(-1).tolist() == bf16_bits, raw.bits
    check_values("i32", tensors["i32"], np.int32, (5,), [-2**31, -1, 0, 1, 2**31 - 1])
    check_values("i64", tensors["i64"], np.int64, (2, 3), [-2**63, -1, 0, 1, 2**63 - 1, 2**40])
    check_values("u8", tensors["u8"], np.uint8, (16, 16), list(range(256)))
    check_values("scalar", tensors["scalar"], np.float32, (), [42.5])
    check_values("num_batches_tracked", tensors["num_batches_tracked"], np.int64, (), [7])
    check_values("empty", tensors["empty"], np.float32, (0, 3), [])


def write_py_files(path, bool_path):
    with np.errstate(over="ignore"):
        f16_rounded = np.array([0.1, 1 / 3, 65519.0, 65520.0], np.float32).astype(np.float16)
    tensors = {
        "py.f32": np.arange(12, dtype=np.float32).reshape(3, 4) * np.float32(0.5) - np.float32(1),
        "py.f64": np.array([1 / 3, -2.5e-310, 1e308]),
        "py.f16": np.array([0x3800, 0xFBFF, 0x0001, 0x7E00], np.uint16).view(np.float16)
                    .reshape(2, 2),
        # numpy's float32 -> float16 rounding, which coltrain's half(float) must match; 65520
        # rounds to Inf, which numpy warns about.
        "py.f16_rounded": f16_rounded,
        # safetensors_io's float32 -> bfloat16 rounding, ties to even in the last two.
        "py.bf16": safetensors_io.BFloat16(
            np.array([1.0, -2.0, 3.140625, 1.00390625, 1.01171875], np.float32)),
        "py.i32": np.array([[-7, 8], [9, -10]], np.int32),
        "py.i64": np.array([2**62, -2**62, 0], np.int64),
        "py.u8": np.array([255, 0, 128], np.uint8),
        "py.scalar": np.array(3.25),
        "py.empty": np.zeros((2, 0, 5), np.int32),
        "py.bigendian": np.array([1.5, 2.5], dtype=">f4"),
        "py.transposed": np.arange(6, dtype=np.float32).reshape(2, 3).T,
    }
    safetensors_io.save(path, tensors, {"producer": "numpy", "note": "\u00fcn\u00efcode \u2713"})
    # The module reads back what it wrote (BF16 through its raw bits).
    again = safetensors_io.load(path, bf16="raw")
    for name, value in tensors.items():
        if isinstance(value, safetensors_io.BFloat16):
            assert (again[name].bits == value.bits).all(), name
        else:
            assert again[name].dtype == value.dtype.newbyteorder("<"), name
            assert again[name].tobytes() == value.astype(again[name].dtype).tobytes(), name

    safetensors_io.save(bool_path, {"mask": np.array([True, False, True])})
    assert safetensors_io.load(bool_path)["mask"].tolist() == [True, False, True]


def main():
    cpp_path, py_path, bool_path = sys.argv[1:4]
    check_cpp_file(cpp_path)
    write_py_files(py_path, bool_path)
    print("python: read coltrain's file and wrote", py_path)


if __name__ == "__main__":
    main()
