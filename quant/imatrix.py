"""Importance matrices (from llama.cpp's llama-imatrix) for the quantizer.

Two formats exist: the GGUF one (tensors ``<weight>.in_sum2`` and ``<weight>.counts``,
and ``imatrix.*`` metadata) and the legacy binary ``.dat``. Either becomes, per weight,
the mean squared activation of each input column (per expert for MoE weights), which
is what ``llama_model_quantize`` takes.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from infer.quant.gguf_check import GGUF_MAGIC, check_gguf
from infer.runtime.errors import InferError, UsageError

_REQUIRED_KEYS = ("imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size")


def load_imatrix(path: Path) -> dict[str, np.ndarray]:
    """Weight name -> float32 importance values."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise UsageError(f"importance matrix {path}: cannot be read ({e})") from None
    try:
        values = _load_gguf(path) if magic == GGUF_MAGIC else _load_legacy(path)
    except InferError as e:
        raise UsageError(f"importance matrix {path}: {e}") from None
    except (struct.error, ValueError) as e:
        raise UsageError(f"importance matrix {path}: not an importance matrix file ({e})") from None
    if not values:
        raise UsageError(f"importance matrix {path}: holds no entries")
    return values


def _load_gguf(path: Path) -> dict[str, np.ndarray]:
    info = check_gguf(path)
    missing = [k for k in _REQUIRED_KEYS if k not in info.metadata]
    if missing:
        raise UsageError(f"missing imatrix metadata {', '.join(missing)}")
    tensors = {t.name: t for t in info.tensors}
    values = {}
    for name, sums_info in tensors.items():
        if not name.endswith(".in_sum2"):
            continue
        weight = name.removesuffix(".in_sum2")
        counts_info = tensors.get(f"{weight}.counts")
        if counts_info is None or sums_info.ggml_type != 0 or counts_info.ggml_type != 0:
            raise UsageError(f"{weight}: needs F32 .in_sum2 and .counts tensors")
        sums = np.fromfile(path, dtype=np.float32, count=sums_info.nbytes // 4, offset=sums_info.offset)
        counts = np.fromfile(path, dtype=np.float32, count=counts_info.nbytes // 4,
                             offset=counts_info.offset)
        per_expert = sums.reshape(len(counts), -1)
        safe = np.where(counts > 0, counts, 1.0)[:, None]
        values[weight] = np.where(counts[:, None] > 0, per_expert / safe, 1.0).astype(np.float32).ravel()
    return values


def _load_legacy(path: Path) -> dict[str, np.ndarray]:
    data = path.read_bytes()
    (n_entries,) = struct.unpack_from("<i", data, 0)
    if n_entries < 1:
        raise ValueError("no entries")
    pos, values = 4, {}
    for _ in range(n_entries):
        (length,) = struct.unpack_from("<i", data, pos)
        name = data[pos + 4: pos + 4 + length].decode("utf-8")
        pos += 4 + length
        ncall, nval = struct.unpack_from("<ii", data, pos)
        pos += 8
        sums = np.frombuffer(data, dtype=np.float32, count=nval, offset=pos)
        pos += 4 * nval
        values[name] = (sums / ncall if ncall > 0 else sums).astype(np.float32)
    return values
