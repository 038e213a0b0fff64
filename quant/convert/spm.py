"""SentencePiece-style BPE with byte fallback (Llama 2, Mistral), from ``tokenizer.json``
alone, as llama.cpp's SentencePiece tokenizer (GGUF model ``llama``): the part of
quant/convert/tokenizer.py that only this kind needs.

llama.cpp's tokenizer merges any two adjacent pieces whose concatenation is a token, best
score first, leftmost on ties; each token's score is minus the rank of the first merge that
makes it, which reproduces the Hugging Face merge order when every split of a token into
two tokens is a merge and a token's merges are listed together (both are checked here).
Only ties between two splits of one token competing for the same piece could still differ
(Hugging Face ranks the splits, llama.cpp takes the leftmost); none was ever seen.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf

from infer.runtime.errors import ModelError

T = gguf.TokenType
SPM_SPACE = "▁"


def spm_scores(tokens: list[str], types: list[int], index: dict[str, int],
               merges: list[tuple[str, str]], path: Path) -> tuple[float, ...]:
    """Scores under which llama.cpp's SentencePiece merge order equals the BPE merge ranks.

    User-defined tokens (added, not special: Gemma's runs of spaces, tabs and newlines,
    its HTML tags) are left out. SentencePiece matches them whole before BPE, and so does
    llama.cpp (longest first); Hugging Face's export makes them with merges ranked before
    all others, listed in no particular order (Gemma 3: 1,395 such merges, interleaved
    run by run), which makes the same tokens. Without them, Gemma 3's merges are listed
    token by token in the order of the token ids, i.e. of SentencePiece's scores.
    """
    user = {tokens[i] for i, kind in enumerate(types) if kind == T.USER_DEFINED}
    first: dict[str, int] = {}
    previous = None
    for rank, (a, b) in enumerate(merges):
        made = a + b
        if made in user:
            continue
        if made != previous and made in first:
            raise ModelError(f"{path}: the merges making {made!r} are not listed together; llama.cpp's "
                             "SentencePiece tokenizer cannot reproduce that order")
        first.setdefault(made, rank)
        previous = made
    pairs = set(merges)
    for text in tokens:
        if text in user:
            continue
        for cut in range(1, len(text)):
            a, b = text[:cut], text[cut:]
            if a in index and b in index and (a, b) not in pairs:
                raise ModelError(f"{path}: {text!r} splits into the tokens {a!r} + {b!r} but no merge "
                                 "joins them; llama.cpp would join them")
    missing = [f"<0x{b:02X}>" for b in range(256) if f"<0x{b:02X}>" not in index]
    if missing:
        raise ModelError(f"{path}: byte_fallback without the byte token {missing[0]}")
    return tuple(-float(first[t]) if t in first else 0.0 for t in tokens)


def spm_user_texts(tokens: list[str], types: list[int], path: Path) -> list[str]:
    """Token texts as llama.cpp's SentencePiece tokenizer needs them: it finds user-defined
    tokens in the text before spaces become "▁", so theirs are written with spaces (as
    llama.cpp's own converter does)."""
    out = [t.replace(SPM_SPACE, " ") if kind == T.USER_DEFINED else t
           for t, kind in zip(tokens, types, strict=True)]
    if len(set(out)) != len(out):
        raise ModelError(f"{path}: a user-defined token is another token with '▁' for ' '; "
                         "llama.cpp needs unique tokens")
    return out


def spm_space_prefix(data: dict[str, Any], path: Path) -> bool:
    """Whether a "▁" starts the text: the Prepend("▁") + Replace(" ", "▁") normalizer, or Metaspace."""
    normalizer, pre = data.get("normalizer"), data.get("pre_tokenizer")
    if (normalizer is not None and pre == {"type": "Split", "pattern": {"String": " "},
                                           "behavior": "MergedWithPrevious", "invert": False}):
        pre = None  # Gemma's: splits at spaces the normalizer has already made "▁", so never
    if (normalizer is None and pre and pre.get("type") == "Metaspace" and not pre.get("split", True)
            and pre.get("replacement") == SPM_SPACE and pre.get("prepend_scheme") in ("always", "never")):
        return pre["prepend_scheme"] == "always"
    if pre is None and normalizer is not None:
        steps = normalizer.get("normalizers", []) if normalizer.get("type") == "Sequence" else [normalizer]
        replace = {"type": "Replace", "pattern": {"String": " "}, "content": SPM_SPACE}
        if steps == [replace]:
            return False
        if steps == [{"type": "Prepend", "prepend": SPM_SPACE}, replace]:
            return True
    raise ModelError(f"{path}: unsupported normalizer/pre-tokenizer for a byte-fallback BPE "
                     f"({(normalizer or {}).get('type')}/{(pre or {}).get('type')})")
