"""GGUF quant types in file names, and which file of a repository to pick.

A Hub repository of GGUFs holds one file (or one set of split files) per quant
type, named by convention: ``Llama-3.2-3B-Instruct-Q5_K_M.gguf``,
``qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf``, ``Q4_K_M/model-Q4_K_M-00001-of-00003.gguf``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from infer.runtime.errors import UsageError

# Without a QUANT, the first of these the repository has is taken: Q4_K_M, then the
# nearest in size and quality, smaller ones before larger ones, full precision last (MXFP4:
# gpt-oss's own 4-bit weights).
PREFERENCE = (
    "Q4_K_M", "Q4_K_S", "IQ4_XS", "IQ4_NL", "Q4_0", "Q4_1", "MXFP4", "MXFP4_MOE", "Q5_K_M", "Q5_K_S", "Q5_0",
    "Q5_1", "Q6_K", "Q3_K_L", "Q3_K_M", "IQ3_M", "Q3_K_S", "IQ3_S", "IQ3_XS", "IQ3_XXS",
    "Q8_0", "Q2_K", "IQ2_M", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ1_M", "IQ1_S", "BF16", "F16",
    "F32",
)

_QUANT = re.compile(
    r"(?<![A-Za-z0-9])((?:UD-)?(?:I?Q[1-8](?:_[A-Z0-9]+)*|TQ[12]_0|BF16|FP?16|FP?32|MXFP4(?:_MOE)?))"
    r"(?![A-Za-z0-9])",
    re.IGNORECASE,
)
# The split-file convention of llama.cpp's gguf-split: NAME-00001-of-00003.gguf.
SPLIT_PART = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


@dataclass(frozen=True)
class QuantFiles:
    """The file or split files of one quant type in a repository."""

    quant: str  # upper case, as in the file name (e.g. Q4_K_M, UD-Q4_K_XL)
    files: tuple[str, ...]  # repository paths; split parts in order, the first first


def quant_of(path: str) -> str | None:
    """The quant type a GGUF file name announces, upper case, or None."""
    name = path.rsplit("/", 1)[-1]
    found = _QUANT.findall(SPLIT_PART.sub(".gguf", name))
    if not found:
        return None
    quant = found[-1].upper()
    return {"FP16": "F16", "FP32": "F32"}.get(quant, quant)


def group_by_quant(paths: list[str]) -> dict[str, QuantFiles]:
    """Group a repository's GGUF files by quant type (projector files left out)."""
    groups: dict[str, list[str]] = {}
    for path in paths:
        name = path.rsplit("/", 1)[-1].lower()
        if not name.endswith(".gguf") or "mmproj" in name:
            continue
        quant = quant_of(path)
        if quant is not None:
            groups.setdefault(quant, []).append(path)
    return {q: QuantFiles(q, tuple(_ordered_parts(files))) for q, files in groups.items()}


# The precision of a repository's projector files, best first (what llama.cpp's -hf takes
# is the one file it finds; repositories with several offer these).
_MMPROJ_PREFERENCE = ("F16", "BF16", "Q8_0", "F32")


def choose_mmproj(paths: list[str], wanted: str | None = None) -> str | None:
    """The repository's multimodal projector file (`mmproj*.gguf`): `wanted` (a catalog entry's
    name for it) if it is there, else the best precision, else the first by name."""
    def name(path: str) -> str:
        return path.rsplit("/", 1)[-1].lower()

    found = sorted(p for p in paths if name(p).endswith(".gguf") and "mmproj" in name(p))
    if wanted is not None and wanted in found:
        return wanted
    for precision in _MMPROJ_PREFERENCE:
        for path in found:
            if precision.lower() in name(path):
                return path
    return found[0] if found else None


def _ordered_parts(files: list[str]) -> list[str]:
    """One unsplit file, or every part a split file announces (present or not), in order."""
    split = sorted(f for f in files if SPLIT_PART.search(f))
    if not split:
        return sorted(files)[:1]  # several unsplit files of one quant: take one, predictably
    return split_part_names(split[0])


def split_part_names(any_part: str) -> list[str]:
    """All the part names of the split file `any_part` belongs to, first to last."""
    match = SPLIT_PART.search(any_part)
    if match is None:
        return [any_part]
    total = match.group(2)
    stem = any_part[: match.start()]
    return [f"{stem}-{i:05d}-of-{total}.gguf" for i in range(1, int(total) + 1)]


def choose(groups: dict[str, QuantFiles], wanted: str | None, *, repo: str) -> QuantFiles:
    """The files for `wanted` (any case), or the preferred quant when None."""
    if not groups:
        raise LookupError(repo)
    if wanted is not None:
        key = wanted.upper()
        if key in groups:
            return groups[key]
        raise UsageError(f"{repo} has no {wanted} file; it has {', '.join(ordered_names(groups))}")
    for quant in PREFERENCE:
        if quant in groups:
            return groups[quant]
    return groups[ordered_names(groups)[0]]


def ordered_names(groups: dict[str, QuantFiles]) -> list[str]:
    rank = {q: i for i, q in enumerate(PREFERENCE)}
    return sorted(groups, key=lambda q: (rank.get(q, len(rank)), q))
