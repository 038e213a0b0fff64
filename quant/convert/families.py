"""The decoder families infer converts, and how each differs from the common layout.

All are decoders with RMS norm, rotary attention and a gated feed-forward:
Llama 2/3/3.1/3.2 (SmolLM, TinyLlama), Mistral, Qwen 2, Qwen 3, Gemma 2, Gemma 3 (text)
and Phi 3. The differences:
- llama.cpp's ``llama`` architecture rotates pairs of adjacent dimensions, so Hugging
  Face's Q/K weights (which rotate halves) are permuted for it; the others rotate
  halves like Hugging Face and take the weights as they are;
- Qwen 2 has Q/K/V biases; Qwen 3 and Gemma 3 have per-head Q/K norms;
- Gemma's RMS norms multiply by (1 + weight): the 1 is added here; Gemma has norms
  after attention and feed-forward too, logit soft-capping (Gemma 2) and sliding
  windows;
- Phi 3 fuses Q/K/V and gate/up projections (llama.cpp takes them fused) and may
  carry LongRoPE factors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import gguf
import numpy as np

from infer.runtime.errors import ModelError

_BLOCK = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
          "ffn_down")
_GEMMA2_BLOCK = (*_BLOCK, "post_attention_norm", "post_ffw_norm")


_BERT_BLOCK = ("attn_q", "attn_k", "attn_v", "attn_output", "attn_output_norm", "ffn_up", "ffn_down",
               "layer_output_norm")


@dataclass(frozen=True)
class Family:
    arch: gguf.MODEL_ARCH
    permute_qk: bool = False  # llama.cpp rotates adjacent pairs: reorder Hugging Face's halves
    norm_offset: float = 0.0  # Gemma's norms scale by (1 + weight)
    block: tuple[str, ...] = _BLOCK  # the tensors every block must have
    top: tuple[str, ...] = ("token_embd", "output_norm")  # the tensors outside the blocks it must have
    decoder: bool = True  # False: an encoder (BERT: quant/convert/bert.py), no output layer
    roberta_positions: bool = False  # its position table starts at pad_token_id + 1 (RoBERTa's)


FAMILIES = {
    "LlamaForCausalLM": Family(gguf.MODEL_ARCH.LLAMA, permute_qk=True),
    "MistralForCausalLM": Family(gguf.MODEL_ARCH.LLAMA, permute_qk=True),
    "Qwen2ForCausalLM": Family(gguf.MODEL_ARCH.QWEN2),
    "Qwen3ForCausalLM": Family(gguf.MODEL_ARCH.QWEN3, block=(*_BLOCK, "attn_q_norm", "attn_k_norm")),
    # (Qwen3-Embedding's sentence-transformers checkpoint: the decoder without its output layer)
    "Qwen3Model": Family(gguf.MODEL_ARCH.QWEN3, block=(*_BLOCK, "attn_q_norm", "attn_k_norm")),
    "Gemma2ForCausalLM": Family(gguf.MODEL_ARCH.GEMMA2, norm_offset=1.0, block=_GEMMA2_BLOCK),
    "Gemma3ForCausalLM": Family(gguf.MODEL_ARCH.GEMMA3, norm_offset=1.0,
                                block=(*_GEMMA2_BLOCK, "attn_q_norm", "attn_k_norm")),
    "Phi3ForCausalLM": Family(gguf.MODEL_ARCH.PHI3, block=("attn_norm", "attn_qkv", "attn_output",
                                                           "ffn_norm", "ffn_up", "ffn_down")),
    "BertModel": Family(gguf.MODEL_ARCH.BERT, block=_BERT_BLOCK, decoder=False,
                        top=("token_embd", "position_embd", "token_embd_norm")),
    "BertForMaskedLM": Family(gguf.MODEL_ARCH.BERT, block=_BERT_BLOCK, decoder=False,
                              top=("token_embd", "position_embd", "token_embd_norm")),
    # a cross-encoder (reranker): the pooler and classifier score [CLS] query [SEP] document [SEP]
    "BertForSequenceClassification": Family(gguf.MODEL_ARCH.BERT, block=_BERT_BLOCK, decoder=False,
                                            top=("token_embd", "position_embd", "token_embd_norm", "cls",
                                                 "cls.output")),
    # XLM-RoBERTa (bge-m3; bge-reranker-v2-m3): a BERT to llama.cpp, with a Unigram tokenizer
    "XLMRobertaModel": Family(gguf.MODEL_ARCH.BERT, block=_BERT_BLOCK, decoder=False, roberta_positions=True,
                              top=("token_embd", "position_embd", "token_embd_norm")),
    "XLMRobertaForSequenceClassification": Family(
        gguf.MODEL_ARCH.BERT, block=_BERT_BLOCK, decoder=False, roberta_positions=True,
        top=("token_embd", "position_embd", "token_embd_norm", "cls", "cls.output")),
}

_POSITIONS = gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.POS_EMBD] + ".weight"


def position_offset(config: dict[str, Any], family: Family) -> int:
    """The rows of a RoBERTa's position table before its first text position (its padding id and
    those below: positions start at pad_token_id + 1), which llama.cpp's table has not; else 0."""
    return int(config.get("pad_token_id", 1)) + 1 if family.roberta_positions else 0


def need(config: dict[str, Any], key: str) -> Any:
    if key not in config:
        raise ModelError(f"config.json lacks {key!r}")
    return config[key]


def head_dim(config: dict[str, Any]) -> int:
    return int(config.get("head_dim") or need(config, "hidden_size") // need(config, "num_attention_heads"))


def rope_settings(config: dict[str, Any]) -> dict[str, Any]:
    """RoPE base and scaling, from `rope_parameters` (transformers 5) or the older keys.

    Gemma 3 gives full and sliding-window layers their own settings; the full one is
    the model's (llama.cpp uses its own base for sliding layers).
    """
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    params = params.get("full_attention", params)
    return {"theta": float(params.get("rope_theta") or config.get("rope_theta") or 10000.0),
            **{k: v for k, v in params.items() if k != "rope_theta"}}


def add_hparams(writer: gguf.GGUFWriter, config: dict[str, Any], family: Family) -> None:
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
    rope = rope_settings(config)
    writer.add_rope_dimension_count(int(dim * float(rope.get("partial_rotary_factor", 1.0))))
    if dim != config["hidden_size"] // n_head or family.norm_offset:
        writer.add_key_length(dim)
        writer.add_value_length(dim)
    writer.add_rope_freq_base(rope["theta"])
    _add_family_hparams(writer, config, family)
    kind = rope.get("rope_type") or rope.get("type")
    if kind in ("longrope", "su"):
        original = int(config.get("original_max_position_embeddings")
                       or rope["original_max_position_embeddings"])
        scale = int(config["max_position_embeddings"]) / original
        writer.add_rope_scaling_orig_ctx_len(original)
        writer.add_rope_scaling_attn_factors(
            math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1.0 else 1.0)
    elif kind == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope["factor"]))
    elif kind == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(float(rope["factor"]))
        writer.add_rope_scaling_orig_ctx_len(int(rope["original_max_position_embeddings"]))
    elif kind not in (None, "default", "llama3"):
        raise ModelError(f"unsupported RoPE scaling {kind!r}")
    writer.add_vocab_size(int(need(config, "vocab_size")))


def _add_family_hparams(writer: gguf.GGUFWriter, config: dict[str, Any], family: Family) -> None:
    if family.arch in (gguf.MODEL_ARCH.GEMMA2, gguf.MODEL_ARCH.GEMMA3):
        if config.get("attn_logit_softcapping"):
            writer.add_attn_logit_softcapping(float(config["attn_logit_softcapping"]))
        if config.get("final_logit_softcapping"):
            writer.add_final_logit_softcapping(float(config["final_logit_softcapping"]))
        if config.get("sliding_window"):
            writer.add_sliding_window(int(config["sliding_window"]))
    if family.arch == gguf.MODEL_ARCH.PHI3:
        # llama.cpp tells Phi 4 (no sliding window) from Phi 3 by a zero here.
        writer.add_sliding_window(int(config.get("sliding_window") or 0))


def extra_tensors(config: dict[str, Any]) -> dict[str, np.ndarray]:
    """Tensors llama.cpp needs that the checkpoint does not hold: RoPE factors."""
    rope = rope_settings(config)
    kind = rope.get("rope_type") or rope.get("type")
    if kind in ("longrope", "su"):
        return {gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FACTORS_LONG] + ".weight":
                np.array(rope["long_factor"], dtype=np.float32),
                gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FACTORS_SHORT] + ".weight":
                np.array(rope["short_factor"], dtype=np.float32)}
    if kind != "llama3":
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


def transforms(family: Family, gguf_name: str) -> bool:
    """Whether `transform` changes this tensor (it then needs the whole tensor at once)."""
    if family.norm_offset and gguf_name.endswith("norm.weight"):
        return True
    if family.roberta_positions and gguf_name == _POSITIONS:
        return True
    return family.permute_qk and gguf_name.endswith(("attn_q.weight", "attn_k.weight"))


def transform(family: Family, config: dict[str, Any], gguf_name: str, data: np.ndarray) -> np.ndarray:
    """Per family: Gemma's (1 + weight) norms; Q/K rows reordered for llama.cpp's rotation."""
    if family.norm_offset and gguf_name.endswith("norm.weight"):
        return data + np.float32(family.norm_offset)
    if family.roberta_positions and gguf_name == _POSITIONS:
        return data[position_offset(config, family):]
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


def ignored(hf_name: str, config: dict[str, Any]) -> bool:
    """Checkpoint entries that are not weights llama.cpp uses (a BERT's or RoBERTa's pooler and
    masked-LM heads: an embedding model pools its own way)."""
    if hf_name == "lm_head.weight" and config.get("tie_word_embeddings"):
        return True  # a copy of the embeddings that some checkpoints store anyway
    if config.get("architectures", [None])[0] == "BertForSequenceClassification" and "pooler." in hf_name:
        return False  # (a cross-encoder's pooler is its classifier's first layer: kept)
    if hf_name.removeprefix("bert.").removeprefix("roberta.").startswith((
            "pooler.", "cls.predictions.", "cls.seq_relationship.", "embeddings.position_ids")):
        return True
    return hf_name.endswith(("rotary_emb.inv_freq", ".masked_bias", ".attn.bias"))
