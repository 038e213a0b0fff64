"""A Hugging Face checkpoint folder: its config and its safetensors tensors, read lazily.

Tensors are located from the safetensors headers alone and read one at a time by
memory map (``gguf.utility.SafetensorsLocal``), never through torch, so converting
needs about as much memory as the largest tensor. Pickle checkpoints (``*.bin``,
``*.pt``) are refused: unpickling a downloaded file can run arbitrary code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf.utility import LocalTensor, SafetensorsLocal

from infer.runtime.errors import ModelError

_DTYPES = {"F32": np.float32, "F16": np.float16}


@dataclass
class Checkpoint:
    folder: Path
    config: dict[str, Any]
    tensors: dict[str, LocalTensor]

    @property
    def architecture(self) -> str:
        archs = self.config.get("architectures") or []
        if not archs or not isinstance(archs[0], str):
            raise ModelError(f"{self.folder}/config.json names no architecture")
        return archs[0]

    def source_dtype(self) -> str:
        """The weights' precision: F32, F16 or BF16 (the most common among 2-D tensors)."""
        kinds = [t.dtype for t in self.tensors.values() if len(t.shape) >= 2]
        return max(set(kinds), key=kinds.count) if kinds else "F32"


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.is_file():
        raise ModelError(f"{folder}: no config.json (not a Hugging Face model folder)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"{path}: malformed config.json ({e})") from None
    if not isinstance(config, dict):
        raise ModelError(f"{path}: malformed config.json (not a JSON object)")
    # Multimodal checkpoints (Gemma 3) keep the language model's settings apart.
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, dict) else config


def open_checkpoint(folder: Path) -> Checkpoint:
    """The config and every tensor of the checkpoint in `folder` (shards merged)."""
    config = read_config(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
        if pickles:
            raise ModelError(f"{folder}: only pickle weights ({pickles[0]}); infer never unpickles "
                             "downloaded files: use a repository with .safetensors weights")
        raise ModelError(f"{folder}: no .safetensors weights")
    tensors: dict[str, LocalTensor] = {}
    for path in files:
        try:
            tensors.update(SafetensorsLocal(path).tensors)
        except (ValueError, KeyError, OSError) as e:
            raise ModelError(f"{path}: not a readable safetensors file ({e})") from None
    return Checkpoint(folder, config, tensors)


_ITEM_SIZE = {"F32": 4, "F16": 2, "BF16": 2}


def read_tensor(tensor: LocalTensor) -> np.ndarray:
    """One tensor as float32 (F32, F16 and BF16 sources)."""
    return read_rows(tensor, 0, tensor.shape[0] if tensor.shape else 1).reshape(tensor.shape)


def read_rows(tensor: LocalTensor, start: int, count: int) -> np.ndarray:
    """Rows [start, start + count) of a tensor as float32, read with plain reads.

    Plain reads rather than a memory map: mapped pages would stay resident (and count
    as the process's memory) until the whole tensor is done.
    """
    if tensor.dtype not in _ITEM_SIZE:
        raise ModelError(f"unsupported tensor type {tensor.dtype} in the checkpoint")
    item = _ITEM_SIZE[tensor.dtype]
    row = item * int(np.prod(tensor.shape[1:], dtype=np.int64)) if len(tensor.shape) > 1 else item
    span = tensor.data_range
    with open(span.filename, "rb") as f:
        f.seek(span.offset + start * row)
        raw = f.read(count * row)
    if len(raw) != count * row:
        raise ModelError(f"{span.filename}: truncated tensor data")
    if tensor.dtype == "BF16":
        return (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.frombuffer(raw, dtype=_DTYPES[tensor.dtype]).astype(np.float32)


def to_bf16(data: np.ndarray) -> np.ndarray:
    """float32 to bfloat16 bits, rounding to nearest even (as torch does)."""
    bits = np.ascontiguousarray(data, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)
