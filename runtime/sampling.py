"""Sampling parameters and the native llama.cpp sampler chain built from them.

``SamplingParams`` is made here from the request parameters' table
(runtime/request_params.py); the CLI collects only the flags a user set and layers them
over the model's recommended defaults (GGUF ``general.sampling.*``) and llama.cpp's own
defaults, in ``SamplingParams.resolve``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import field, make_dataclass, replace
from typing import Any

from infer.runtime.errors import UsageError
from infer.runtime.json_schema import json_schema_to_grammar
from infer.runtime.llama import Model, SamplerChain, SamplerSpec
from infer.runtime.request_params import SAMPLING, logit_bias_error, out_of_range, parse_logit_bias

__all__ = ["SamplingParams", "build_sampler_chain", "json_schema_to_grammar", "model_sampling_defaults",
           "parse_logit_bias", "sampler_specs"]

# GGUF `general.sampling.*` keys (written by llama.cpp's converter from a model's
# generation_config.json) -> SamplingParams fields.
MODEL_DEFAULT_KEYS = {p.gguf: p.field for p in SAMPLING.values() if p.gguf}


class _Sampling:
    """The behaviour of SamplingParams, whose fields are the request parameters' table."""

    def __post_init__(self) -> None:
        _validate(self)
        if self.json_schema is not None and self._schema_grammar is None:
            object.__setattr__(self, "_schema_grammar", json_schema_to_grammar(self.json_schema))

    @classmethod
    def resolve(cls, model_defaults: Mapping[str, Any], overrides: Mapping[str, Any]) -> SamplingParams:
        """llama.cpp's defaults, then the model's recommendations, then the user's flags."""
        unknown = set(overrides) - set(SAMPLING)
        if unknown:
            raise UsageError(f"unknown sampling parameter(s): {', '.join(sorted(unknown))}")
        merged = {k: v for k, v in model_defaults.items() if k in SAMPLING}
        merged.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**merged)

    def with_seed(self) -> SamplingParams:
        """A copy with a concrete seed, so that a random run can be reproduced."""
        if self.seed is not None:
            return self
        return replace(self, seed=int.from_bytes(os.urandom(4), "little") % 0xFFFFFFFF)

    @property
    def effective_grammar(self) -> str | None:
        return self.grammar if self.grammar is not None else self._schema_grammar

    @property
    def grammar_spec(self) -> SamplerSpec | None:
        """The grammar sampler's settings (None: no grammar)."""
        grammar = self.effective_grammar
        if grammar is None:
            return None
        return SamplerSpec("grammar", (grammar, "root", self._grammar_triggers) if self._grammar_triggers
                           else (grammar,))


# How to pick each next token and when to stop: a frozen dataclass with one field per entry
# of runtime/request_params.py's table (its default llama.cpp's), validated on creation.
SamplingParams: Any = make_dataclass(
    "SamplingParams",
    [*((p.field, p.annotation, field(default=p.default)) for p in SAMPLING.values()),
     ("_schema_grammar", "str | None", field(default=None, repr=False, compare=False)),
     # A grammar that waits for one of these patterns (regular expressions over the text
     # generated so far, whose first group is where the grammar starts): llama.cpp's lazy grammar
     # (`tool_choice: auto`: free text, then calls held to their grammar once one begins)
     ("_grammar_triggers", "tuple[str, ...]", field(default=(), repr=False)),
     # Control tokens whose text the reply shows (a tool call's markers, as gpt-oss' <|channel|>:
     # a control token's text is otherwise empty, and the calls could not be read)
     ("_shown_tokens", "frozenset[int]", field(default=frozenset(), repr=False))],
    bases=(_Sampling,), frozen=True)
SamplingParams.__module__ = __name__  # (for pickle and repr; make_dataclass's `module=` is 3.12's)
SamplingParams.__doc__ = "How to pick each next token and when to stop. Defaults are llama.cpp's."


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise UsageError(message)


def _refuse(problem: str | None) -> None:
    if problem is not None:
        raise UsageError(problem)


def _validate(p: Any) -> None:
    for param in SAMPLING.values():  # (runtime/request_params.py: one rule per range)
        value = getattr(p, param.field)
        if param.range is not None and value is not None:
            _refuse(out_of_range(param.field, value))
    _check(p.max_tokens is None or p.max_tokens >= 0,
           f"max tokens must be >= 0 (or -1 for no limit), got {p.max_tokens}")
    _check(all(s for s in p.stop), "stop strings must not be empty")
    _check(not (p.grammar is not None and p.json_schema is not None),
           "give either a grammar or a JSON schema, not both")
    for token, bias in p.logit_bias:
        _refuse(logit_bias_error(token))
        _check(not math.isnan(bias), "logit bias must be a number")


def model_sampling_defaults(meta: Callable[[str], str | None]) -> dict[str, Any]:
    """The model's recommended sampling settings from its GGUF metadata."""
    out: dict[str, Any] = {}
    for key, name in MODEL_DEFAULT_KEYS.items():
        raw = meta(key)
        if raw is None:
            continue
        try:
            out[name] = int(float(raw)) if SAMPLING[name].kind == "int" else float(raw)
        except ValueError:
            continue
    return out


def sampler_specs(p: SamplingParams, *, n_vocab: int,
                  eog_tokens: Callable[[], list[int]]) -> list[SamplerSpec]:
    """The native sampler chain for `p`, as data, in llama.cpp's default order.

    Logit bias, grammar, penalties, DRY, then top-k, typical, top-p, min-p, XTC,
    temperature and the random draw (or greedy at temperature 0, or mirostat).
    `p` must have a concrete seed (``with_seed``).
    """
    seed = p.seed
    specs: list[SamplerSpec] = []
    biases = list(p.logit_bias)
    for token, _ in biases:
        _refuse(logit_bias_error(token, n_vocab))
    if p.ignore_eos:  # as llama.cpp does: end-of-generation tokens can never be drawn
        biases += [(token, -math.inf) for token in eog_tokens()]
    if biases:
        specs.append(SamplerSpec("logit_bias", (tuple(biases),)))
    if p.grammar_spec is not None:
        specs.append(p.grammar_spec)
    if p.repeat_penalty != 1.0 or p.presence_penalty or p.frequency_penalty:
        specs.append(SamplerSpec("penalties", (n_vocab, p.repeat_last_n, p.repeat_penalty,
                                               p.frequency_penalty, p.presence_penalty)))
    if p.dry_multiplier > 0:
        specs.append(SamplerSpec("dry", (p.dry_multiplier, p.dry_base, p.dry_allowed_length,
                                         p.dry_penalty_last_n, p.dry_sequence_breakers)))
    if p.temperature <= 0:
        return [*specs, SamplerSpec("greedy")]
    if p.mirostat == 1:
        return [*specs, SamplerSpec("temp", (p.temperature,)),
                SamplerSpec("mirostat", (n_vocab, seed, p.mirostat_tau, p.mirostat_eta, 100))]
    if p.mirostat == 2:
        return [*specs, SamplerSpec("temp", (p.temperature,)),
                SamplerSpec("mirostat_v2", (seed, p.mirostat_tau, p.mirostat_eta))]
    if p.top_n_sigma > 0:  # llama.cpp's order: after DRY, before top-k
        specs.append(SamplerSpec("top_n_sigma", (p.top_n_sigma,)))
    if p.top_k > 0:
        specs.append(SamplerSpec("top_k", (p.top_k,)))
    if p.typical_p < 1:
        specs.append(SamplerSpec("typical", (p.typical_p, 1)))
    if p.top_p < 1:
        specs.append(SamplerSpec("top_p", (p.top_p, 1)))
    if p.min_p > 0:
        specs.append(SamplerSpec("min_p", (p.min_p, 1)))
    if p.xtc_probability > 0:
        specs.append(SamplerSpec("xtc", (p.xtc_probability, p.xtc_threshold, 1, seed)))
    return [*specs, SamplerSpec("temp", (p.temperature,)), SamplerSpec("dist", (seed,))]


def build_sampler_chain(p: SamplingParams, model: Model) -> SamplerChain:
    """The native sampler chain for `p` on `model`."""
    p = p.with_seed()
    return SamplerChain(model, sampler_specs(p, n_vocab=model.n_vocab, eog_tokens=model.eog_tokens))
