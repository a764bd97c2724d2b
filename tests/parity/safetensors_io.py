"""Minimal safetensors reader and writer on numpy alone, for coltrain's PyTorch parity scripts.

The `safetensors` package is not a dependency of coltrain's tests; this module reads and writes the
same format (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length N, N
bytes of UTF-8 JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}},
then the tensors' bytes back to back, offsets relative to the end of the header.

numpy has no bfloat16: `load` widens BF16 tensors to float32 (exact), or returns them as `BFloat16`
with bf16="raw"; `save` writes a `BFloat16` value as BF16. From PyTorch:
    save(path, {"w": t.detach().cpu().numpy()})             # float32/float64/float16/int...
    save(path, {"w": BFloat16(t.float().cpu().numpy())})    # a bfloat16 tensor, bits kept
    torch.from_numpy(load(path)["w"])
"""

from __future__ import annotations

import json
import os
import struct
import tempfile

import numpy as np

__all__ = ["BFloat16", "save", "load", "load_metadata"]

MAX_HEADER_BYTES = 100_000_000  # as the reference implementation

_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_NAMES = {(dtype.kind, dtype.itemsize): name for name, dtype in _DTYPES.items()}


class BFloat16:
    """bfloat16 values, kept as their 16-bit patterns (numpy has no bfloat16 dtype)."""

    def __init__(self, values):
        """Rounds float32 values to bfloat16, to nearest with ties to even (PyTorch's rounding)."""
        floats = np.asarray(values, dtype=np.float32)
        # Flat, so that 0-d input does not turn into numpy scalars with their own casting rules;
        # 64-bit, so that the rounding carry cannot overflow.
        flat = floats.reshape(-1)
        bits = flat.view(np.uint32).astype(np.uint64)
        one, half_ulp, shift = np.uint64(1), np.uint64(0x7FFF), np.uint64(16)
        rounded = (bits + half_ulp + ((bits >> shift) & one)) >> shift
        # A NaN stays NaN: keep its top bits, quieted, instead of letting the carry make it Inf.
        quiet_nan = (bits >> shift) | np.uint64(0x0040)
        self.bits = np.where(np.isnan(flat), quiet_nan, rounded).astype(np.uint16).reshape(
            floats.shape)

    @classmethod
    def from_bits(cls, bits) -> "BFloat16":
        result = cls.__new__(cls)
        result.bits = np.array(bits, dtype=np.uint16)
        return result

    @property
    def shape(self) -> tuple:
        return self.bits.shape

    def to_float32(self) -> np.ndarray:
        """The exact float32 values."""
        wide = self.bits.reshape(-1).astype(np.uint32) << np.uint32(16)  # flat: 0-d stays an array
        return wide.view(np.float32).reshape(self.bits.shape)

    def __repr__(self) -> str:
        return f"BFloat16({self.to_float32()!r})"


def _as_record(name: str, value):
    """(dtype name, shape, little-endian C-order bytes) of one tensor."""
    if isinstance(value, BFloat16):
        return "BF16", list(value.shape), value.bits.astype("<u2").tobytes()
    array = np.asarray(value)
    key = (array.dtype.kind, array.dtype.itemsize)
    if key not in _NAMES:
        raise TypeError(f"tensor {name!r}: numpy dtype {array.dtype} has no safetensors dtype "
                        "(use BFloat16(...) for bfloat16)")
    dtype_name = _NAMES[key]
    # tobytes() writes C order whatever the array's strides.
    return dtype_name, list(array.shape), array.astype(_DTYPES[dtype_name], copy=False).tobytes()


def save(path, tensors: dict, metadata: dict | None = None) -> None:
    """Writes `tensors` (name -> numpy array or BFloat16) to `path`, replacing it atomically."""
    if metadata is not None:
        for key, value in metadata.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise TypeError(f"metadata must map str to str, not {key!r}: {value!r}")
    records = []
    for name, value in tensors.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise ValueError(f"invalid tensor name {name!r}")
        records.append((name, *_as_record(name, value)))
    # Widest elements first, as coltrain's and the reference writer do: every tensor then starts
    # aligned for its element type.
    records.sort(key=lambda record: -(2 if record[1] == "BF16" else _DTYPES[record[1]].itemsize))

    header = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, dtype_name, shape, data in records:
        header[name] = {"dtype": dtype_name, "shape": shape,
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # spaces up to a multiple of 8, as the reference writer

    directory = os.path.dirname(os.path.abspath(path))
    # A bounded prefix keeps the temporary name within the filesystem's limit.
    fd, temp = tempfile.mkstemp(prefix="." + os.path.basename(path)[:100] + ".", dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(struct.pack("<Q", len(text)))
            out.write(text)
            for record in records:
                out.write(record[3])
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temp, 0o644)  # mkstemp creates 0600; a checkpoint is usually shared
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise


def _fail(path, message: str):
    raise ValueError(f"{path}: {message}")


def _no_duplicates(pairs):
    keys = [key for key, _ in pairs]
    if len(keys) != len(set(keys)):
        raise ValueError(f"duplicate key in header: {sorted(k for k in keys if keys.count(k) > 1)}")
    return dict(pairs)


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _parse(path):
    """(entries sorted by offset, metadata, data section), validated like coltrain's reader."""
    with open(path, "rb") as f:
        content = f.read()
    if len(content) < 8:
        _fail(path, f"file is {len(content)} bytes, too short for the header length")
    (n,) = struct.unpack_from("<Q", content, 0)
    if n > MAX_HEADER_BYTES or n > len(content) - 8:
        _fail(path, f"header length {n} is larger than the file or the limit")
    try:
        header = json.loads(content[8:8 + n].decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError) as e:
        _fail(path, f"header is not valid JSON: {e}")
    if not isinstance(header, dict):
        _fail(path, "header is not a JSON object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        _fail(path, "__metadata__ is not a map of strings")

    data = memoryview(content)[8 + n:]
    entries = []
    for name, info in header.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            _fail(path, f"tensor {name!r}: entry needs exactly dtype, shape, data_offsets")
        dtype_name, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if dtype_name != "BF16" and dtype_name not in _DTYPES:
            _fail(path, f"tensor {name!r}: unsupported dtype {dtype_name!r}")
        if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
            _fail(path, f"tensor {name!r}: shape {shape!r} is not a list of non-negative integers")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_is_count, offsets))
                or offsets[0] > offsets[1]):
            _fail(path, f"tensor {name!r}: data_offsets {offsets!r} are not [begin, end]")
        itemsize = 2 if dtype_name == "BF16" else _DTYPES[dtype_name].itemsize
        if offsets[1] - offsets[0] != int(np.prod(shape, dtype=object)) * itemsize:
            _fail(path, f"tensor {name!r}: size mismatch between data_offsets {offsets} and "
                        f"shape {shape} of {dtype_name}")
        entries.append((offsets[0], offsets[1], name, dtype_name, shape))
    entries.sort()
    covered = 0
    for begin, end, name, _, _ in entries:
        if begin != covered:
            _fail(path, f"tensor {name!r}: {'gap' if begin > covered else 'overlap'} at {begin}")
        covered = end
    if covered != len(data):
        _fail(path, f"data section holds {len(data)} bytes but the tensors cover {covered}")
    return entries, metadata, data


def load(path, bf16: str = "float32") -> dict:
    """name -> numpy array (own, writable memory) for every tensor of `path`.

    BF16 tensors become float32 (bf16="float32", exact) or BFloat16 (bf16="raw")."""
    if bf16 not in ("float32", "raw"):
        raise ValueError(f"bf16 must be 'float32' or 'raw', not {bf16!r}")
    entries, _, data = _parse(path)
    result = {}
    for begin, end, name, dtype_name, shape in entries:
        dtype = np.dtype("<u2") if dtype_name == "BF16" else _DTYPES[dtype_name]
        array = np.frombuffer(data[begin:end], dtype=dtype).reshape(shape).copy()
        if dtype_name == "BF16":
            value = BFloat16.from_bits(array)
            result[name] = value if bf16 == "raw" else value.to_float32()
        else:
            result[name] = array
    return result


def load_metadata(path) -> dict:
    """The __metadata__ map of `path` (empty when it has none)."""
    return dict(_parse(path)[1])
