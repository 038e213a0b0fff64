"""What BERT-family encoders (embedding models) need beyond the decoders' conversion, and
the pooling every embedding checkpoint records (issue 37).

- The hyperparameters llama.cpp's ``bert`` architecture reads: layer-norm epsilon, attention
  both ways (not causal), the token-type count.
- An XLM-RoBERTa (bge-m3) as llama.cpp reads it, a BERT: its position table without the rows
  before its first position, and its SentencePiece Unigram tokenizer (quant/convert/unigram.py).
- The WordPiece vocabulary as llama.cpp's WPM tokenizer reads it: a word-initial piece gets
  the phantom space "▁" in front, a continuation loses its "##", special tokens stay as they
  are; [CLS] is the BOS and [SEP] closes each text (both added); BertNormalizer's lowercasing
  (and accent stripping) is recorded for llama.cpp to apply.
- The pooling of a sentence-transformers checkpoint (modules.json, then its Pooling module's
  config.json: mean, cls or last token), written as ``{arch}.pooling_type``, so that llama.cpp
  pools as sentence-transformers does; its Normalize module needs nothing in the file (infer
  embed normalizes by default, as llama.cpp's tools do).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf

from infer.quant.convert.families import Family, need, position_offset
from infer.quant.convert.tokenizer import K, T, Vocab, read_json
from infer.runtime.errors import ModelError

_POOLING = {"pooling_mode_mean_tokens": gguf.PoolingType.MEAN, "pooling_mode_cls_token": gguf.PoolingType.CLS,
            "pooling_mode_lasttoken": gguf.PoolingType.LAST}
_POOLING_NAMES = {"mean": gguf.PoolingType.MEAN, "cls": gguf.PoolingType.CLS,
                  "lasttoken": gguf.PoolingType.LAST}


def pooling_type(folder: Path) -> gguf.PoolingType | None:
    """The pooling a sentence-transformers checkpoint in `folder` says (None: not one)."""
    modules = folder / "modules.json"
    if not modules.is_file():
        return None
    try:
        listed = json.loads(modules.read_text(encoding="utf-8"))
        found = next((m["path"] for m in listed if str(m.get("type", "")).endswith("Pooling")), None)
        if found is None:
            return None
        config = json.loads((folder / found / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelError(f"{modules}: cannot read the sentence-transformers pooling ({e})") from None
    for key, kind in _POOLING.items():
        if config.get(key):
            return kind
    if config.get("pooling_mode") in _POOLING_NAMES:
        return _POOLING_NAMES[config["pooling_mode"]]
    raise ModelError(f"{folder / found / 'config.json'}: a pooling llama.cpp does not do (it pools by mean, "
                     "cls or last token)")


def add_bert_hparams(writer: gguf.GGUFWriter, config: dict[str, Any], family: Family) -> None:
    writer.add_context_length(int(need(config, "max_position_embeddings")) - position_offset(config, family))
    writer.add_embedding_length(int(need(config, "hidden_size")))
    writer.add_feed_forward_length(int(need(config, "intermediate_size")))
    writer.add_block_count(int(need(config, "num_hidden_layers")))
    writer.add_head_count(int(need(config, "num_attention_heads")))
    writer.add_layer_norm_eps(float(config.get("layer_norm_eps", 1e-12)))
    writer.add_causal_attention(False)
    writer.add_token_type_count(int(config.get("type_vocab_size", 2)))
    if config.get("hidden_act", "gelu") not in ("gelu", "gelu_new"):
        raise ModelError(f"a BERT whose activation is {config['hidden_act']!r}: llama.cpp's BERT uses GELU")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ModelError("a BERT with relative position embeddings: llama.cpp's BERT has absolute ones")
    writer.add_vocab_size(int(need(config, "vocab_size")))


def load_encoder_vocab(folder: Path) -> tuple[Vocab, Callable[[gguf.GGUFWriter], None]]:
    """An encoder's tokenizer (WordPiece: BERT; Unigram: XLM-RoBERTa) as llama.cpp reads it, and
    what writes the keys it needs beyond add_vocab's."""
    path = folder / "tokenizer.json"
    data = read_json(path, required=True)  # (read once: a multilingual one is many megabytes)
    if (data.get("model") or {}).get("type") == "Unigram":
        from infer.quant.convert.unigram import load_unigram

        return load_unigram(data, path)
    vocab, flags = load_wordpiece(data, path)
    return vocab, lambda writer: add_wordpiece_flags(writer, flags)


def load_wordpiece(data: dict[str, Any], path: Path) -> tuple[Vocab, dict[str, bool]]:
    """A WordPiece tokenizer.json (`data`, read from `path`) as llama.cpp's WPM vocabulary, and
    the normalizer flags to record (lowercase, strip_accents)."""
    try:
        model = data["model"]
        if model.get("type") != "WordPiece":
            raise ModelError(f"{path}: a BERT model whose tokenizer is {model.get('type')!r}, not WordPiece")
        if model.get("continuing_subword_prefix", "##") != "##":
            raise ModelError(f"{path}: a WordPiece continuation prefix other than '##'")
        by_id = {int(i): text for text, i in model["vocab"].items()}
        special = {int(t["id"]): t["content"] for t in data.get("added_tokens") or [] if t.get("special")}
        n = max(by_id) + 1
        tokens, types = [], []
        for i in range(n):
            text = by_id.get(i, f"[PAD{i}]")
            if i in special or i not in by_id:
                tokens.append(text)
                types.append(int(T.CONTROL if i in special else T.UNUSED))
            else:
                tokens.append(text[2:] if text.startswith("##") else "\u2581" + text)
                types.append(int(T.NORMAL))
        index = {text: i for i, text in enumerate(tokens)}
        ids = {}
        for key, names in ((K.BOS_ID, ("[CLS]", "<s>")), (K.SEP_ID, ("[SEP]", "</s>")),
                           (K.UNK_ID, ("[UNK]", "<unk>")), (K.PAD_ID, ("[PAD]", "<pad>")),
                           (K.MASK_ID, ("[MASK]", "<mask>"))):
            found = next((index[n] for n in names if n in index), None)
            if found is not None:
                ids[key] = found
        if K.BOS_ID not in ids or K.SEP_ID not in ids:
            raise ModelError(f"{path}: no [CLS] and [SEP] tokens")
        normalizer = data.get("normalizer") or {}
        flags = {}
        if normalizer.get("type") == "BertNormalizer":
            flags["lowercase"] = bool(normalizer.get("lowercase", True))
            if normalizer.get("strip_accents") is not None:
                flags["strip_accents"] = bool(normalizer["strip_accents"])
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise ModelError(f"{path}: malformed tokenizer ({type(e).__name__}: {e})") from e
    if len(set(tokens)) != len(tokens):
        raise ModelError(f"{path}: two WordPiece tokens become the same llama.cpp token")
    vocab = Vocab("bert", "default", tuple(tokens), tuple(types), None, (), ids, True, False, None, None)
    return vocab, flags


def add_wordpiece_flags(writer: gguf.GGUFWriter, flags: dict[str, bool]) -> None:
    """[SEP] closes each text; BertNormalizer's options as llama.cpp reads them."""
    writer.add_add_sep_token(True)
    for name, value in flags.items():
        writer.add_bool(f"tokenizer.ggml.normalizer.{name}", value)
