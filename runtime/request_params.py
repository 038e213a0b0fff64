"""The request parameters' ranges, declared once: every surface that takes a sampling value
(the CLI's flags, chat's /set, the server's request bodies, SamplingParams itself) refuses
a value outside its range with the same check and the same words, naming it its own way
("--top-p" on the command line, "top_p" in a request).

Imports nothing native: the server's request validation and the CLI use it before any
model is loaded. (Issue 31 grows this into the whole parameter table: flag spellings, API
names, defaults and help.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Range:
    """low <= value <= high, either end open (strict) or absent (unbounded)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    only: tuple[int, ...] = ()  # an enumeration instead (mirostat: 0, 1 or 2)

    def holds(self, value: float) -> bool:
        if self.only:
            return value in self.only
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.high_open else value > self.high))

    def words(self) -> str:
        """'in [0, 1]', 'in (0, 1]', '>= -1', '> 0', '0, 1 or 2'."""
        if self.only:
            *rest, last = (str(v) for v in self.only)
            return f"{', '.join(rest)} or {last}"
        if self.low is not None and self.high is not None:
            return (f"in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}"
                    f"{')' if self.high_open else ']'}")
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {_num(self.low)}"
        if self.high is not None:
            return f"{'<' if self.high_open else '<='} {_num(self.high)}"
        return "a number"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


@dataclass(frozen=True)
class Numeric:
    """A numeric request parameter: its SamplingParams field, kind and range."""

    field: str
    kind: type  # int or float
    range: Range
    label: str  # its name in the runtime's words ("top-p"); a request names it its own way


# One rule each. Where the server and the runtime disagreed, the rule is llama.cpp's (what
# its samplers do something sensible with): temperature has no upper bound (OpenAI's cap of
# 2 was the server's alone), top-p and typical-p take 0 (the most likely token alone, as
# OpenAI's top_p 0; the runtime refused it), the repeat penalty and mirostat's tau and eta
# must be above 0 (the server took 0: a division by zero), presence and frequency penalties
# are unbounded (OpenAI's [-2, 2] was the server's alone).
NUMERIC: dict[str, Numeric] = {p.field: p for p in (
    Numeric("temperature", float, Range(0), "temperature"),
    Numeric("top_k", int, Range(0), "top-k"),
    Numeric("top_p", float, Range(0, 1), "top-p"),
    Numeric("min_p", float, Range(0, 1), "min-p"),
    Numeric("typical_p", float, Range(0, 1), "typical-p"),
    Numeric("repeat_penalty", float, Range(0, low_open=True), "repeat penalty"),
    Numeric("repeat_last_n", int, Range(-1), "repeat-last-n"),
    Numeric("presence_penalty", float, Range(), "presence penalty"),
    Numeric("frequency_penalty", float, Range(), "frequency penalty"),
    Numeric("seed", int, Range(0, 0xFFFFFFFF), "seed"),
    Numeric("mirostat", int, Range(only=(0, 1, 2)), "mirostat"),
    Numeric("mirostat_tau", float, Range(0, low_open=True), "mirostat tau"),
    Numeric("mirostat_eta", float, Range(0, low_open=True), "mirostat eta"),
    Numeric("dry_multiplier", float, Range(0), "DRY multiplier"),
    Numeric("dry_base", float, Range(1), "DRY base"),
    Numeric("dry_allowed_length", int, Range(0), "DRY allowed length"),
    Numeric("dry_penalty_last_n", int, Range(-1), "DRY penalty-last-n"),
    Numeric("xtc_probability", float, Range(0, 1), "XTC probability"),
    Numeric("xtc_threshold", float, Range(0, 1), "XTC threshold"),
)}


def out_of_range(field: str, value: float, name: str | None = None) -> str | None:
    """Why `value` cannot be `field` (called `name` where it was given; by default the
    runtime's words for it), or None."""
    param = NUMERIC[field]
    name = name or param.label
    if isinstance(value, float) and math.isnan(value):
        return f"{name} must be a number, got NaN"
    if isinstance(value, float) and math.isinf(value) and param.range == Range():
        return f"{name} must be finite, got {value}"
    return None if param.range.holds(value) else f"{name} must be {param.range.words()}, got {value}"


def logit_bias_error(token: int, n_vocab: int | None = None) -> str | None:
    """Why `token` cannot take a logit bias (outside the vocabulary of `n_vocab`), or None."""
    if token < 0:
        return f"logit bias token id must be >= 0, got {token}"
    if n_vocab is not None and token >= n_vocab:
        return f"logit bias token id {token} is outside the vocabulary of {n_vocab}"
    return None
