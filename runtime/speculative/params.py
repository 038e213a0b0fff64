"""Speculation's settings: ``SpecParams``, named after llama.cpp's ``--spec-*`` flags."""

from __future__ import annotations

import math
from dataclasses import dataclass

from infer.runtime.errors import UsageError

SPEC_TYPES = ("auto", "none", "ngram", "draft")


@dataclass(frozen=True)
class SpecParams:
    """How to speculate; names follow llama.cpp's ``--spec-*`` flags.

    ``type``: ``auto`` is prompt lookup, cost-aware (it proposes only when the
    measured cost and acceptance say it pays; a draft model makes it ``draft``);
    ``none`` turns speculation off. ``n_min == n_max`` is a fixed draft length
    (proposed whenever the proposer has that many tokens), for comparisons.
    """

    type: str = "auto"
    n_max: int = 16
    n_min: int = 0
    p_min: float = 0.75  # a draft model's guess must be at least this likely (its own softmax)
    ngram_size: int = 4  # the longest n-gram looked up (down to 1)

    def __post_init__(self) -> None:
        if self.type not in SPEC_TYPES:
            raise UsageError(f"--spec-type must be one of {', '.join(SPEC_TYPES)}, got {self.type!r}")
        if not 1 <= self.n_max <= 64:
            raise UsageError(f"--spec-draft-n-max must be in [1, 64], got {self.n_max}")
        if not 0 <= self.n_min <= self.n_max:
            raise UsageError(f"--spec-draft-n-min must be in [0, --spec-draft-n-max], got {self.n_min}")
        if not 0 <= self.p_min <= 1 or math.isnan(self.p_min):
            raise UsageError(f"--draft-p-min must be in [0, 1], got {self.p_min}")
        if not 1 <= self.ngram_size <= 16:
            raise UsageError(f"--spec-ngram-size must be in [1, 16], got {self.ngram_size}")

    @property
    def fixed(self) -> bool:
        return self.n_min == self.n_max

    @property
    def enabled(self) -> bool:
        return self.type != "none"
