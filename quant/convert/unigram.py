"""A SentencePiece Unigram tokenizer (XLM-RoBERTa's: bge-m3, bge-reranker-v2-m3) from its
``tokenizer.json``, as llama.cpp's UGM tokenizer (GGUF model ``t5``) reads it (issue 37).

The pieces and their scores are the Unigram model's, in id order (fairseq's <s> <pad> </s>
<unk> first, as Hugging Face's export lists them); the special tokens are control tokens and
the unknown token is UNKNOWN. What SentencePiece does to a text before it is cut, Hugging Face
writes as normalizers and a pre-tokenizer, and llama.cpp reads as keys:

- the Precompiled normalizer's charsmap (NFKC and the like, as a trie) goes in as
  ``tokenizer.ggml.precompiled_charsmap``, which llama.cpp applies the same way;
- a Replace of runs of spaces by one space, or a WhitespaceSplit pre-tokenizer (transformers'
  export of today), is SentencePiece's remove_extra_whitespaces;
- a Metaspace pre-tokenizer that prepends "▁" is add_space_prefix.

Each text is <s> text </s> (add BOS and EOS); a pair is <s> a </s></s> b </s>, as llama.cpp
and Hugging Face join them.
"""

from __future__ import annotations

import base64
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf

from infer.quant.convert.tokenizer import K, T, Vocab
from infer.runtime.errors import ModelError


def load_unigram(data: dict[str, Any], path: Path) -> tuple[Vocab, Callable[[gguf.GGUFWriter], None]]:
    """A Unigram tokenizer.json (`data`, read from `path`) as llama.cpp's UGM vocabulary, and
    what writes its normalization keys."""
    try:
        model = data["model"]
        if model.get("type") != "Unigram":
            raise ModelError(f"{path}: a tokenizer of type {model.get('type')!r}, not Unigram")
        if model.get("byte_fallback"):
            raise ModelError(f"{path}: a Unigram tokenizer with byte fallback (llama.cpp's UGM has none)")
        pieces = [(str(text), float(score)) for text, score in model["vocab"]]
        unk = model.get("unk_id")
        special = {int(t["id"]): t["content"] for t in data.get("added_tokens") or [] if t.get("special")}
        tokens, types, scores = [], [], []
        for i, (text, score) in enumerate(pieces):
            tokens.append(text)
            scores.append(score)
            types.append(int(T.UNKNOWN if i == unk else T.CONTROL if i in special else T.NORMAL))
        for i in sorted(special):  # (added after the model's pieces: XLM-R's <mask>)
            if i >= len(tokens):
                if i != len(tokens):
                    raise ModelError(f"{path}: added token {i} leaves a gap after the {len(tokens)} pieces")
                tokens.append(special[i])
                scores.append(0.0)
                types.append(int(T.CONTROL))
        index = {text: i for i, text in enumerate(tokens)}
        ids = {key: index[name] for key, name in ((K.BOS_ID, "<s>"), (K.EOS_ID, "</s>"), (K.SEP_ID, "</s>"),
                                                   (K.UNK_ID, "<unk>"), (K.PAD_ID, "<pad>"),
                                                   (K.MASK_ID, "<mask>")) if name in index}
        if K.BOS_ID not in ids or K.EOS_ID not in ids:
            raise ModelError(f"{path}: no <s> and </s> tokens")
        charsmap, collapse = _normalizer(data.get("normalizer"), path)
        prefix, split = _space_prefix(data.get("pre_tokenizer"), path)
        doubled = _pair_doubles_eos(data.get("post_processor"))
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise ModelError(f"{path}: malformed tokenizer ({type(e).__name__}: {e})") from e
    vocab = Vocab("t5", "default", tuple(tokens), tuple(types), tuple(scores), (), ids, True, True, prefix,
                  None)

    def finish(writer: gguf.GGUFWriter) -> None:
        if charsmap:
            writer.add_precompiled_charsmap(charsmap)
        writer.add_remove_extra_whitespaces(collapse or split)
        if doubled:  # a pair is <s> a </s></s> b </s>: the second </s> is the SEP llama.cpp adds
            writer.add_add_sep_token(True)

    return vocab, finish


def _pair_doubles_eos(spec: Any) -> bool:
    """Whether the post-processor joins a pair with two </s> (RoBERTa's), not one."""
    if not spec:
        return False
    if spec.get("type") == "RobertaProcessing":
        return True
    if spec.get("type") == "Sequence":
        return any(_pair_doubles_eos(step) for step in spec.get("processors") or [])
    pair = [step.get("SpecialToken", {}).get("id") for step in spec.get("pair") or []]
    return any(a == b == "</s>" for a, b in itertools.pairwise(pair))


def _steps(spec: Any, key: str) -> list[dict[str, Any]]:
    """A normalizer's or pre-tokenizer's steps: a Sequence's, or itself."""
    if not spec:
        return []
    return list(spec.get(key) or []) if spec.get("type") == "Sequence" else [spec]


def _normalizer(spec: Any, path: Path) -> tuple[bytes, bool]:
    """The Precompiled charsmap (empty: none) and whether runs of spaces become one."""
    charsmap, collapse = b"", False
    for step in _steps(spec, "normalizers"):
        kind = step.get("type")
        if kind == "Precompiled":
            charsmap = base64.b64decode(step.get("precompiled_charsmap") or "")
        elif kind == "Replace" and (step["pattern"].get("Regex"), step.get("content")) == (" {2,}", " "):
            collapse = True
        else:
            raise ModelError(f"{path}: a {kind} normalizer, which llama.cpp's Unigram tokenizer does not "
                             "apply")
    return charsmap, collapse


def _space_prefix(spec: Any, path: Path) -> tuple[bool, bool]:
    """Whether the Metaspace pre-tokenizer puts "▁" before the text, and whether a WhitespaceSplit
    before it drops the spaces at the ends and between words but one (as remove_extra_whitespaces)."""
    prefix = split = False
    for step in _steps(spec, "pretokenizers"):
        kind = step.get("type")
        if kind == "Metaspace":
            if step.get("replacement", "\u2581") != "\u2581":
                raise ModelError(f"{path}: a Metaspace replacement other than '\u2581'")
            prefix = bool(step.get("add_prefix_space", True)) and step.get("prepend_scheme") != "never"
        elif kind == "WhitespaceSplit":
            split = True
        else:
            raise ModelError(f"{path}: a {kind} pre-tokenizer, which llama.cpp's Unigram tokenizer does "
                             "not apply")
    return prefix, split
