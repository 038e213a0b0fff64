"""What a GGUF file is, read from its header alone (no weights are loaded).

This uses infer's own strict header parser rather than ``gguf.GGUFReader``, which
builds a Python object per vocabulary string: about 20 s for a 128k vocabulary on
this project's machines, against 0.1 s here.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from infer.quant.gguf_check import GGML_TYPES, check_gguf
from infer.quant.quants import split_part_names


def describe(path: Path) -> dict[str, Any]:
    """Architecture, size, quantization, shape, vocabulary, license, sampling, chat template."""
    first = check_gguf(path)
    others = [path.with_name(name) for name in split_part_names(path.name)[1:]]
    parts = [first, *(check_gguf(p) for p in others)]
    meta, arch = first.metadata, first.architecture or "unknown"

    def arch_key(name: str) -> Any:
        return meta.get(f"{arch}.{name}")

    types: Counter[str] = Counter()
    parameters = 0
    for part in parts:
        for t in part.tensors:
            types[GGML_TYPES[t.ggml_type][0]] += 1
            parameters += math.prod(t.shape)
    tokens = meta.get("tokenizer.ggml.tokens")
    return {
        "architecture": arch,
        "name": meta.get("general.name"),
        "parameters": parameters,
        "tensor_types": dict(types.most_common()),
        "context_length": arch_key("context_length"),
        "layers": arch_key("block_count"),
        "heads": arch_key("attention.head_count"),
        "kv_heads": arch_key("attention.head_count_kv"),
        "embedding": arch_key("embedding_length"),
        "vocab_size": getattr(tokens, "length", len(tokens)) if tokens is not None else None,
        "tokenizer": meta.get("tokenizer.ggml.model"),
        "license": meta.get("general.license"),
        "sampling": {k.removeprefix("general.sampling."): v for k, v in meta.items()
                     if k.startswith("general.sampling.")},
        "chat_template": meta.get("tokenizer.chat_template"),
        "split_parts": len(parts),
    }

