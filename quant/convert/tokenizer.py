"""Hugging Face ``tokenizer.json`` to GGUF tokenizer metadata that llama.cpp tokenizes with exactly.

Two kinds of BPE tokenizer are supported:

* byte-level BPE (Llama 3, Qwen 2/3, GPT-2): GGUF model ``gpt2`` with the merges, and
  the pre-tokenizer named after its Split regex (``tokenizer.ggml.pre``);
* SentencePiece-style BPE with byte fallback (Llama 2, Mistral), from ``tokenizer.json``
  alone: GGUF model ``llama``, llama.cpp's SentencePiece tokenizer, with scores that
  reproduce the Hugging Face merge order (quant/convert/spm.py).

What llama.cpp cannot do is refused with a ModelError rather than converted into a
file that tokenizes differently. Not reproduced, as llama.cpp lacks them: added tokens'
lstrip/rstrip flags; the NFC normalizer of byte-level tokenizers (text already in NFC,
the usual case, tokenizes the same); and llama.cpp makes any token spelled like an
end-of-generation token ("</s>", "<|endoftext|>", ...) a control token, even an
ordinary one such as Qwen's "</s>".
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf

from infer.quant.convert.spm import spm_scores, spm_space_prefix, spm_user_texts
from infer.runtime.errors import ModelError

K = gguf.Keys.Tokenizer
T = gguf.TokenType

# The Split regex of a byte-level tokenizer.json (and whether its BPE ignores merges for
# words that are whole tokens) -> the llama.cpp pre-tokenizer implementing it.
_LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT2 = "<ByteLevel use_regex>"  # GPT-2's regex, built into the ByteLevel pre-tokenizer
PRE_TOKENIZERS: dict[tuple[str, bool], str] = {
    (_LLAMA3_REGEX, True): "llama-bpe",
    (_QWEN2_REGEX, False): "qwen2",
    (_GPT2, False): "gpt-2",
}
# Tokens that end a turn, and fill-in-the-middle tokens, found by their text. The FIM ids
# are written so that llama.cpp keeps the tokens' types (it promotes such tokens to
# control tokens when it has to guess them).
EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<end_of_turn>", "<|end|>")
FIM_TEXTS = {"<|fim_prefix|>": K.FIM_PRE_ID, "<|fim_suffix|>": K.FIM_SUF_ID,
             "<|fim_middle|>": K.FIM_MID_ID, "<|fim_pad|>": K.FIM_PAD_ID,
             "<|repo_name|>": K.FIM_REP_ID, "<|file_sep|>": K.FIM_SEP_ID}
_ROLE_KEYS = {"bos": K.BOS_ID, "eos": K.EOS_ID, "unk": K.UNK_ID, "pad": K.PAD_ID}
_BYTE_TOKEN = re.compile(r"<0x[0-9A-F]{2}>")


@dataclass(frozen=True)
class Vocab:
    """A tokenizer ready to be written: every token, its type and score, and the settings."""

    model: str  # tokenizer.ggml.model: "gpt2" or "llama"
    pre: str  # tokenizer.ggml.pre
    tokens: tuple[str, ...]
    types: tuple[int, ...]  # gguf.TokenType per token
    scores: tuple[float, ...] | None  # "llama" only
    merges: tuple[str, ...]  # "gpt2" only: "left right", best first
    special_ids: Mapping[str, int]  # GGUF key (tokenizer.ggml.bos_token_id, ...) -> token id
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool | None  # "llama" only
    chat_template: str | list[dict[str, str]] | None


@dataclass(frozen=True)
class VocabInfo:
    """What add_vocab wrote."""

    model: str
    pre: str
    n_tokens: int  # tokens written, padding included: the embedding's row count
    n_padding: int  # [PAD{i}] tokens appended to reach n_vocab
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    unk_id: int | None
    pad_id: int | None
    add_bos: bool
    add_eos: bool
    has_chat_template: bool


def load_vocab(folder: Path) -> Vocab:
    """Read and check `folder`'s tokenizer.json, tokenizer_config.json and chat template."""
    path = folder / "tokenizer.json"
    data = read_json(path, required=True)
    config = read_json(folder / "tokenizer_config.json", required=False)
    template = _chat_template(folder, config)
    try:
        model = data["model"]
        byte_fallback = _check_bpe(model, path)
        tokens, types = _token_table(model, list(data.get("added_tokens") or []), byte_fallback, path)
        index = {text: i for i, text in enumerate(tokens)}
        merges = _merge_pairs(model["merges"], path)
        specials = _special_ids(config, model, folder, tokens, types, index)
        add_bos, add_eos = _post_processor_adds(data.get("post_processor"), specials, path)
        if byte_fallback:
            scores = spm_scores(tokens, types, index, merges, path)
            return Vocab("llama", "default", tuple(spm_user_texts(tokens, types, path)), tuple(types),
                         scores, (), specials, add_bos, add_eos, spm_space_prefix(data, path), template)
        return Vocab("gpt2", _byte_level_pre(data, model, path), tuple(tokens), tuple(types), None,
                     _merge_strings(merges, path), specials, add_bos, add_eos, None, template)
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        detail = " ".join(str(e).split())
        raise ModelError(f"{path}: malformed tokenizer ({type(e).__name__}: {detail})") from e


def add_vocab(writer: gguf.GGUFWriter, vocab: Vocab, *, n_vocab: int | None = None) -> VocabInfo:
    """Write every ``tokenizer.*`` key of `vocab`; pad to `n_vocab` tokens with unused ``[PAD{i}]``."""
    n = len(vocab.tokens)
    if n_vocab is not None and n_vocab < n:
        raise ModelError(f"the tokenizer has {n} tokens but the model's vocab_size is {n_vocab}")
    pads = [f"[PAD{i}]" for i in range(n, n_vocab or n)]
    padding = len(pads)
    if pads and not set(pads).isdisjoint(vocab.tokens):
        raise ModelError("a padding token's text [PAD{i}] is already a token of the tokenizer")
    writer.add_tokenizer_model(vocab.model)
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list([*vocab.tokens, *pads])
    writer.add_token_types([*vocab.types, *[T.UNUSED] * padding])
    if vocab.scores is not None:
        writer.add_token_scores([*vocab.scores, *[0.0] * padding])
    if vocab.merges:
        writer.add_token_merges(list(vocab.merges))
    if vocab.add_space_prefix is not None:
        writer.add_add_space_prefix(vocab.add_space_prefix)
    for key, token in vocab.special_ids.items():
        writer.add_uint32(key, token)
    writer.add_add_bos_token(vocab.add_bos)
    writer.add_add_eos_token(vocab.add_eos)
    if vocab.chat_template:
        writer.add_chat_template(vocab.chat_template)
    ids = vocab.special_ids
    return VocabInfo(vocab.model, vocab.pre, n + padding, padding, ids.get(K.BOS_ID), ids.get(K.EOS_ID),
                     ids.get(K.EOT_ID), ids.get(K.UNK_ID), ids.get(K.PAD_ID), vocab.add_bos,
                     vocab.add_eos, bool(vocab.chat_template))


# -- reading ---------------------------------------------------------------------------


def read_json(path: Path, *, required: bool) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise ModelError(f"{path}: missing (a Hugging Face tokenizer.json is required)")
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ModelError(f"{path}: cannot read: {e}") from e
    except json.JSONDecodeError as e:
        raise ModelError(f"{path}: malformed JSON: {e.msg} at line {e.lineno} column {e.colno}") from e
    if not isinstance(data, dict):
        raise ModelError(f"{path}: malformed: not a JSON object")
    return data


def _check_bpe(model: dict[str, Any], path: Path) -> bool:
    """Refuse what llama.cpp cannot tokenize like; return whether the BPE falls back to bytes."""
    kind = model.get("type", "BPE" if "merges" in model else None)
    if kind != "BPE":
        raise ModelError(f"{path}: unsupported tokenizer model type {kind!r} (only BPE can be converted)")
    if model.get("dropout") or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise ModelError(f"{path}: unsupported BPE options (dropout, subword prefix or word suffix)")
    return bool(model.get("byte_fallback"))


def _token_table(model: dict[str, Any], added: list[dict[str, Any]], byte_fallback: bool,
                 path: Path) -> tuple[list[str], list[int]]:
    """Every token's text and type, by id; ids no token has become unused [PAD{i}]."""
    by_id: dict[int, tuple[str, int]] = {}
    for text, i in model["vocab"].items():
        kind = T.BYTE if byte_fallback and _BYTE_TOKEN.fullmatch(text) else T.NORMAL
        by_id[int(i)] = (text, kind)
    if model.get("unk_token") in model["vocab"]:
        by_id[model["vocab"][model["unk_token"]]] = (model["unk_token"], T.UNKNOWN)
    for token in added:
        i, text = int(token["id"]), str(token["content"])
        if by_id.get(i, (None, T.NORMAL))[1] not in (T.UNKNOWN, T.BYTE):
            by_id[i] = (text, T.CONTROL if token.get("special") else T.USER_DEFINED)
    if not by_id or min(by_id) < 0:
        raise ModelError(f"{path}: malformed: no tokens, or a negative token id")
    n = max(by_id) + 1
    tokens = [by_id.get(i, (f"[PAD{i}]", T.UNUSED))[0] for i in range(n)]
    types = [int(by_id.get(i, ("", T.UNUSED))[1]) for i in range(n)]
    seen: set[str] = set()
    for text in tokens:
        if text in seen:
            raise ModelError(f"{path}: two tokens have the same text {text!r}; llama.cpp needs unique tokens")
        seen.add(text)
    return tokens, types


def _merge_pairs(raw: list[Any], path: Path) -> list[tuple[str, str]]:
    """Merges, best first, whether written as "a b" strings or as ["a", "b"] lists."""
    pairs = []
    for m in raw:
        pair = m.split(" ", 1) if isinstance(m, str) else m
        if len(pair) != 2 or not all(isinstance(p, str) and p for p in pair):
            raise ModelError(f"{path}: malformed merge {m!r}")
        pairs.append((pair[0], pair[1]))
    return pairs


def _merge_strings(merges: list[tuple[str, str]], path: Path) -> tuple[str, ...]:
    bad = next((p for p in merges if " " in p[0] or " " in p[1]), None)
    if bad:
        raise ModelError(f"{path}: merge {bad!r} has a space in a token, which GGUF merges cannot hold")
    return tuple(f"{a} {b}" for a, b in merges)


# -- byte-level BPE ----------------------------------------------------------------------


def _byte_level_pre(data: dict[str, Any], model: dict[str, Any], path: Path) -> str:
    """The llama.cpp pre-tokenizer that splits text like tokenizer.json's pre_tokenizer."""
    normalizer = data.get("normalizer")
    if normalizer is not None and normalizer.get("type") != "NFC":
        raise ModelError(f"{path}: unsupported normalizer {normalizer.get('type')!r} for byte-level BPE")
    pre = data.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    kinds = [s.get("type") for s in steps]
    if kinds == ["Split", "ByteLevel"] and not steps[1].get("use_regex", True):
        split = steps[0]
        regex = split.get("pattern", {}).get("Regex")
        if regex is None or split.get("behavior") != "Isolated" or split.get("invert"):
            raise ModelError(f"{path}: unsupported Split pre-tokenizer {split!r}")
    elif kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        regex = _GPT2
    else:
        raise ModelError(f"{path}: not a byte-level BPE pre-tokenizer llama.cpp knows: {kinds}")
    if steps[-1].get("add_prefix_space"):
        raise ModelError(f"{path}: byte-level add_prefix_space is not supported by llama.cpp")
    name = PRE_TOKENIZERS.get((regex, bool(model.get("ignore_merges"))))
    if name is None:
        raise ModelError(f"{path}: unknown byte-level BPE pre-tokenizer regex {regex!r} "
                         f"(ignore_merges={bool(model.get('ignore_merges'))})")
    return name


# -- special tokens, post-processor, chat template ----------------------------------------


def _token_text(value: Any) -> str | None:
    """A tokenizer_config.json token entry: a string, or a dict with "content"."""
    return value.get("content") if isinstance(value, dict) else value


def _special_ids(config: dict[str, Any], model: dict[str, Any], folder: Path, tokens: list[str],
                 types: list[int], index: dict[str, int]) -> dict[str, int]:
    """BOS/EOS/UNK/PAD from tokenizer_config.json (else config.json's ids), EOT and FIM by text."""
    fallback = read_json(folder / "config.json", required=False)
    ids: dict[str, int] = {}
    for role, key in _ROLE_KEYS.items():
        text = _token_text(config.get(f"{role}_token"))
        if role == "unk" and text is None:
            text = model.get("unk_token")
        if text is not None:
            if text not in index:
                raise ModelError(f"{folder}/tokenizer_config.json: {role}_token {text!r} is not a token")
            ids[key] = index[text]
            continue
        value = fallback.get(f"{role}_token_id")
        value = value[0] if isinstance(value, list) and value else value
        if isinstance(value, int) and 0 <= value < len(tokens):
            ids[key] = value
    eot = next((index[t] for t in EOT_TEXTS if t in index and types[index[t]] == T.CONTROL), None)
    if eot is not None:
        ids[K.EOT_ID] = eot
    ids.update({key: index[text] for text, key in FIM_TEXTS.items() if text in index})
    return ids


def _post_processor_adds(processor: dict[str, Any] | None, ids: dict[str, int],
                         path: Path) -> tuple[bool, bool]:
    """Whether encoding adds BOS and EOS, as tokenizer.json's post-processor does.

    Hugging Face follows the post-processor (transformers ignores tokenizer_config.json's
    add_bos_token/add_eos_token when a tokenizer.json exists), so this does too. A token
    the template adds becomes BOS/EOS when tokenizer_config.json names none.
    """
    if processor is None or processor.get("type") == "ByteLevel":
        return False, False
    if processor.get("type") == "Sequence":
        parts = [_post_processor_adds(p, ids, path) for p in processor.get("processors", [])]
        return any(a[0] for a in parts), any(a[1] for a in parts)
    if processor.get("type") != "TemplateProcessing":
        raise ModelError(f"{path}: unsupported post-processor {processor.get('type')!r}")
    single = processor["single"]
    specials = [i for i, item in enumerate(single) if "SpecialToken" in item]
    if any(0 < i < len(single) - 1 for i in specials) or len(single) - len(specials) != 1:
        raise ModelError(f"{path}: the post-processor adds tokens llama.cpp cannot add: {single!r}")
    adds: list[bool] = []
    for position, key in ((0, K.BOS_ID), (len(single) - 1, K.EOS_ID)):
        item = single[position].get("SpecialToken")
        if item is not None:
            token_ids = processor["special_tokens"][item["id"]]["ids"]
            if len(token_ids) != 1 or ids.setdefault(key, token_ids[0]) != token_ids[0]:
                raise ModelError(f"{path}: the post-processor adds {item['id']!r}, which is not the "
                                 f"{'BOS' if position == 0 else 'EOS'} token of tokenizer_config.json")
        adds.append(item is not None)
    return adds[0], adds[1]


def _chat_template(folder: Path, config: dict[str, Any]) -> str | list[dict[str, str]] | None:
    """chat_template.jinja if present (it takes priority in transformers), else tokenizer_config.json's."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        try:
            return jinja.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ModelError(f"{jinja}: cannot read: {e}") from e
    template = config.get("chat_template")
    if template is None or isinstance(template, str):
        return template
    if isinstance(template, list) and all(isinstance(t, dict) for t in template):
        return template
    raise ModelError(f"{folder}/tokenizer_config.json: malformed chat_template")
