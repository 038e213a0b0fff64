"""Strict, pure-Python validation of GGUF files before llama.cpp opens them.

llama.cpp trusts the counts and offsets in a GGUF header; a truncated or hostile
file can make it read out of bounds or allocate absurd amounts. Every count,
length and offset is checked here against the file's real size first, so a bad
file becomes an ``InvalidModelFileError`` with a one-line reason.

The format (version 2 and 3): magic ``GGUF``, uint32 version, uint64 tensor
count, uint64 metadata count, the metadata key/value pairs, the tensor infos,
padding to ``general.alignment``, then the tensor data.
"""

from __future__ import annotations

import itertools
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infer.runtime.errors import InvalidModelFileError, ModelNotFoundError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
# Arrays longer than this are validated but not kept in the returned metadata
# (the vocabulary's token list, scores, merges): callers only need scalars.
KEEP_ARRAY_MAX = 64

# Metadata value types: (struct format, size) for fixed-size ones.
_SCALAR = {
    0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
    6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8),
}
_STRING, _ARRAY = 8, 9

# ggml tensor types: (name, elements per block, bytes per block), from ggml.h /
# gguf's GGML_QUANT_SIZES. Removed types (Q4_2, Q4_3, Q4_0_4_4...) are absent on purpose.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # absolute offset in the file
    nbytes: int


@dataclass(frozen=True)
class GGUFInfo:
    """What a valid file holds: its version, metadata and tensor table."""

    path: Path
    version: int
    metadata: dict[str, Any] = field(repr=False)
    tensors: tuple[TensorInfo, ...] = field(repr=False)
    file_size: int = 0
    # key -> (value type, array element type or None), as GGUF numbers them
    value_types: dict[str, tuple[int, int | None]] = field(default_factory=dict, repr=False)

    @property
    def architecture(self) -> str | None:
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None

    @property
    def pooling(self) -> str | None:
        """The pooling an embedding model records (mean, cls, last; rank: a reranker's); None
        for a model that records none (a chat model)."""
        from infer.runtime.params import recorded_pooling

        return recorded_pooling(self.metadata.get(f"{self.architecture}.pooling_type"))


class _Reader:
    """Bounds-checked little-endian reads over a memory-mapped file."""

    def __init__(self, buf: memoryview | bytes, path: Path, keep_arrays: bool = False) -> None:
        self.keep_arrays = keep_arrays
        self.buf = buf
        self.size = len(buf)
        self.pos = 0
        self.path = path

    def fail(self, reason: str) -> InvalidModelFileError:
        return InvalidModelFileError(self.path, reason)

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(
                f"truncated: {what} needs {n} bytes at offset {self.pos}, "
                f"file has {self.size}"
            )

    def scalar(self, fmt: str, size: int, what: str) -> Any:
        self.need(size, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def u32(self, what: str) -> int:
        return int(self.scalar("<I", 4, what))

    def u64(self, what: str) -> int:
        return int(self.scalar("<Q", 8, what))

    def string(self, what: str) -> str:
        n = self.u64(f"{what} length")
        self.need(n, what)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not valid UTF-8") from None

    def skip_strings(self, count: int, what: str) -> None:
        """Walk `count` strings, checking each length, without decoding them."""
        buf, pos, size = self.buf, self.pos, self.size
        unpack = struct.Struct("<Q").unpack_from
        for _ in range(count):
            if pos + 8 > size:
                self.pos = pos
                self.need(8, f"{what} length")
            (n,) = unpack(buf, pos)
            pos += 8 + n
            if pos > size:
                self.pos = pos - n
                self.need(n, what)
        self.pos = pos


def _read_value(r: _Reader, vtype: int, key: str) -> Any:
    if vtype in _SCALAR:
        fmt, size = _SCALAR[vtype]
        return r.scalar(fmt, size, f"value of {key}")
    if vtype == _STRING:
        return r.string(f"value of {key}")
    if vtype == _ARRAY:
        etype = r.u32(f"array type of {key}")
        count = r.u64(f"array length of {key}")
        if etype == _STRING:
            # Each string takes at least its 8-byte length.
            if count * 8 > r.size - r.pos:
                raise r.fail(f"array {key} claims {count} strings, more than the file holds")
            if count > KEEP_ARRAY_MAX and not r.keep_arrays:
                r.skip_strings(count, f"element of {key}")
                return _LongArray(count)
            return [r.string(f"element of {key}") for _ in range(count)]
        if etype in _SCALAR:
            fmt, size = _SCALAR[etype]
            r.need(count * size, f"array {key} of {count} elements")
            if count > KEEP_ARRAY_MAX and not r.keep_arrays:
                r.pos += count * size
                return _LongArray(count)
            values = list(struct.unpack_from(f"<{count}{fmt[1]}", r.buf, r.pos))
            r.pos += count * size
            return values
        if etype == _ARRAY:
            raise r.fail(f"nested arrays are not supported (key {key})")
        raise r.fail(f"unknown array element type {etype} for key {key}")
    raise r.fail(f"unknown value type {vtype} for key {key}")


class _LongArray(list):
    """Stands in for a long array that was validated but not loaded; keeps its length."""

    def __init__(self, length: int) -> None:
        super().__init__()
        self.length = length

    def __repr__(self) -> str:
        return f"<array of {self.length}>"


def _tensor_nbytes(r: _Reader, name: str, shape: tuple[int, ...], ggml_type: int) -> int:
    if ggml_type not in GGML_TYPES:
        raise r.fail(f"tensor {name} has unknown type {ggml_type}")
    _, block, type_size = GGML_TYPES[ggml_type]
    n = 1
    for d in shape:
        if d <= 0:
            raise r.fail(f"tensor {name} has a non-positive dimension {d}")
        n *= d
    if shape[0] % block:
        raise r.fail(f"tensor {name}: row of {shape[0]} is not a multiple of block size {block}")
    return n // block * type_size


def _read_tensor_infos(r: _Reader, count: int) -> list[tuple[str, tuple[int, ...], int, int]]:
    infos = []
    seen: set[str] = set()
    for i in range(count):
        name = r.string(f"name of tensor {i}")
        if name in seen:
            raise r.fail(f"duplicate tensor name {name}")
        seen.add(name)
        n_dims = r.u32(f"dimension count of tensor {name}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise r.fail(f"tensor {name} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
        shape = tuple(r.u64(f"shape of tensor {name}") for _ in range(n_dims))
        ggml_type = r.u32(f"type of tensor {name}")
        offset = r.u64(f"offset of tensor {name}")
        infos.append((name, shape, ggml_type, offset))
    return infos


def _check_tensor_layout(
    r: _Reader, infos: list[tuple[str, tuple[int, ...], int, int]], alignment: int
) -> tuple[TensorInfo, ...]:
    data_start = -(-r.pos // alignment) * alignment
    tensors = []
    for name, shape, ggml_type, rel in infos:
        nbytes = _tensor_nbytes(r, name, shape, ggml_type)
        if rel % alignment:
            raise r.fail(f"tensor {name} offset {rel} is not aligned to {alignment}")
        start = data_start + rel
        if start + nbytes > r.size:
            raise r.fail(
                f"tensor {name} data ({nbytes} bytes at offset {start}) "
                f"runs past the end of the file ({r.size} bytes)"
            )
        tensors.append(TensorInfo(name, shape, ggml_type, start, nbytes))
    ordered = sorted(tensors, key=lambda t: t.offset)
    for a, b in itertools.pairwise(ordered):
        if a.offset + a.nbytes > b.offset:
            raise r.fail(f"tensors {a.name} and {b.name} overlap")
    return tuple(tensors)


def parse(buf: memoryview | bytes, path: Path, *, keep_arrays: bool = False) -> GGUFInfo:
    """Validate a whole GGUF image held in `buf`; raise InvalidModelFileError if bad.

    Long arrays (the vocabulary) are checked but left out of the metadata unless
    `keep_arrays` is set.
    """
    r = _Reader(buf, path, keep_arrays)
    r.need(4, "magic")
    if bytes(buf[:4]) != GGUF_MAGIC:
        raise r.fail(f"wrong magic {bytes(buf[:4])!r} (expected b'GGUF')")
    r.pos = 4
    version = r.u32("version")
    if version not in SUPPORTED_VERSIONS:
        raise r.fail(f"unsupported GGUF version {version}")
    n_tensors = r.u64("tensor count")
    n_kv = r.u64("metadata count")
    # Every metadata pair takes at least 8 (key length) + 4 (type) + 1 bytes,
    # every tensor info at least 8 + 4 + 8 + 4 + 8.
    if n_kv * 13 > r.size - r.pos:
        raise r.fail(f"metadata count {n_kv} is larger than the file can hold")
    if n_tensors * 32 > r.size - r.pos:
        raise r.fail(f"tensor count {n_tensors} is larger than the file can hold")
    metadata: dict[str, Any] = {}
    value_types: dict[str, tuple[int, int | None]] = {}
    for i in range(n_kv):
        key = r.string(f"key of metadata entry {i}")
        if key in metadata:
            raise r.fail(f"duplicate metadata key {key}")
        vtype = r.u32(f"type of {key}")
        etype = None
        if vtype == _ARRAY and r.pos + 4 <= r.size:
            (etype,) = struct.unpack_from("<I", buf, r.pos)
        metadata[key] = _read_value(r, vtype, key)
        value_types[key] = (vtype, etype)
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise r.fail(f"general.alignment {alignment!r} is not a power of two")
    infos = _read_tensor_infos(r, n_tensors)
    tensors = _check_tensor_layout(r, infos, alignment)
    return GGUFInfo(path, version, metadata, tensors, r.size, value_types)


def check_gguf(path: str | Path, *, keep_arrays: bool = False) -> GGUFInfo:
    """Check the GGUF file at `path` strictly and return its metadata and tensor table."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            size = f.seek(0, 2)
            if size == 0:
                raise InvalidModelFileError(p, "the file is empty")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                view = memoryview(mm)
                try:
                    return parse(view, p, keep_arrays=keep_arrays)
                finally:
                    view.release()
    except FileNotFoundError:
        raise ModelNotFoundError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise ModelNotFoundError(f"{p}: is a directory, not a GGUF file") from None
    except PermissionError:
        raise ModelNotFoundError(f"{p}: permission denied") from None
