"""Llama-style decoders: Llama 2/3/3.1/3.2, SmolLM, TinyLlama, Mistral, Qwen 2 and Qwen 3.

They share one layout (RMS norm, rotary attention, SwiGLU feed-forward) and differ in
small ways: llama.cpp's ``llama`` architecture rotates pairs of adjacent dimensions,
so Hugging Face's Q/K weights (which rotate halves) are permuted for it; ``qwen2``
and ``qwen3`` rotate halves like Hugging Face and take the weights as they are; Qwen 2
has Q/K/V biases and Qwen 3 per-head Q/K norms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import gguf
import numpy as np

from infer.runtime.errors import ModelError


@dataclass(frozen=True)
class Family:
    arch: gguf.MODEL_ARCH
    permute_qk: bool  # llama.cpp rotates adjacent pairs: reorder Hugging Face's halves


FAMILIES = {
    "LlamaForCausalLM": Family(gguf.MODEL_ARCH.LLAMA, permute_qk=True),
    "MistralForCausalLM": Family(gguf.MODEL_ARCH.LLAMA, permute_qk=True),
    "Qwen2ForCausalLM": Family(gguf.MODEL_ARCH.QWEN2, permute_qk=False),
    "Qwen3ForCausalLM": Family(gguf.MODEL_ARCH.QWEN3, permute_qk=False),
}


def need(config: dict[str, Any], key: str) -> Any:
    if key not in config:
        raise ModelError(f"config.json lacks {key!r}")
    return config[key]


def head_dim(config: dict[str, Any]) -> int:
    return int(config.get("head_dim") or need(config, "hidden_size") // need(config, "num_attention_heads"))


def rope_settings(config: dict[str, Any]) -> dict[str, Any]:
    """RoPE base and scaling, from `rope_parameters` (transformers 5) or the older keys."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    return {"theta": float(params.get("rope_theta") or config.get("rope_theta") or 10000.0),
            **{k: v for k, v in params.items() if k != "rope_theta"}}


def add_hparams(writer: gguf.GGUFWriter, config: dict[str, Any]) -> None:
    """The hyperparameters llama.cpp reads for these architectures."""
    n_head = int(need(config, "num_attention_heads"))
    writer.add_context_length(int(need(config, "max_position_embeddings")))
    writer.add_embedding_length(int(need(config, "hidden_size")))
    writer.add_feed_forward_length(int(need(config, "intermediate_size")))
    writer.add_block_count(int(need(config, "num_hidden_layers")))
    writer.add_head_count(n_head)
    writer.add_head_count_kv(int(config.get("num_key_value_heads") or n_head))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
    dim = head_dim(config)
    writer.add_rope_dimension_count(dim)
    if dim != config["hidden_size"] // n_head:
        writer.add_key_length(dim)
        writer.add_value_length(dim)
    rope = rope_settings(config)
    writer.add_rope_freq_base(rope["theta"])
    kind = rope.get("rope_type") or rope.get("type")
    if kind == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope["factor"]))
    elif kind == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(float(rope["factor"]))
        writer.add_rope_scaling_orig_ctx_len(int(rope["original_max_position_embeddings"]))
    elif kind not in (None, "default", "llama3"):
        raise ModelError(f"unsupported RoPE scaling {kind!r}")
    writer.add_vocab_size(int(need(config, "vocab_size")))


def extra_tensors(config: dict[str, Any]) -> dict[str, np.ndarray]:
    """Tensors llama.cpp needs that the checkpoint does not hold (Llama 3's RoPE factors)."""
    rope = rope_settings(config)
    if (rope.get("rope_type") or rope.get("type")) != "llama3":
        return {}
    dim, base, factor = head_dim(config), rope["theta"], float(rope["factor"])
    low, high = float(rope.get("low_freq_factor", 1.0)), float(rope.get("high_freq_factor", 4.0))
    old_ctx = float(rope.get("original_max_position_embeddings", 8192))
    factors = []
    for i in range(0, dim, 2):
        wavelen = 2 * math.pi * base ** (i / dim)
        if wavelen < old_ctx / high:
            factors.append(1.0)
        elif wavelen > old_ctx / low:
            factors.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            factors.append(1.0 / ((1 - smooth) / factor + smooth))
    name = gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight"
    return {name: np.array(factors, dtype=np.float32)}


def transform(family: Family, config: dict[str, Any], gguf_name: str, data: np.ndarray) -> np.ndarray:
    """Reorder Q/K rows for llama.cpp's rotation convention where the family needs it."""
    if not family.permute_qk:
        return data
    n_head = int(config["num_attention_heads"])
    if gguf_name.endswith("attn_q.weight"):
        return _permute(data, n_head)
    if gguf_name.endswith("attn_k.weight"):
        return _permute(data, int(config.get("num_key_value_heads") or n_head))
    return data


def _permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """Per head, interleave the two halves of the rows: [a0..an, b0..bn] -> [a0, b0, a1, b1, ...]."""
    rows = weights.shape[0]
    return (weights.reshape(n_head, 2, rows // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def ignored(hf_name: str) -> bool:
    """Checkpoint entries that are not weights llama.cpp uses."""
    return hf_name.endswith(("rotary_emb.inv_freq", ".masked_bias", ".attn.bias"))
