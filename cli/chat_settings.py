"""`/set` in `infer chat`: a sampling parameter (or the context size) read from what the
user typed, and the listing of `/set` alone."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from infer.runtime.errors import UsageError

_PARAM_ALIASES = {"temp": "temperature", "max-tokens": "max_tokens", "num_ctx": "ctx", "ctx-size": "ctx",
                 "ctx_size": "ctx"}

_LIST_HINT = " (/set alone lists them)"


def parse_setting(arg: str, *, hint: str = _LIST_HINT, no_ctx: str | None = None) -> dict[str, Any]:
    """`/set PARAM VALUE` read into the one override it makes, {name: value}: a sampling
    parameter in SamplingParams' spelling, or "ctx" for the context size. `hint` follows the
    error for an unknown name; `no_ctx`, where the context is not the chat's to set, is the
    error `/set ctx` gets."""
    key, _, value = arg.partition(" ")
    value = value.strip()
    key = _PARAM_ALIASES.get(key, key.replace("-", "_"))
    if key == "ctx":
        if no_ctx is not None:
            raise UsageError(no_ctx)
        return {key: _parse_value("int", "ctx", value)}
    if key not in param_names():
        raise UsageError(f"unknown parameter {key!r}{hint}")
    return {key: _parse_value(_param_types()[key], key, value)}


def list_settings(params: Any, n_ctx: int) -> str:
    """`/set` alone with the model loaded here: every sampling parameter, then the context size."""
    return "\n".join([f"{n} = {getattr(params, n)!r}" for n in param_names()] + [f"ctx = {n_ctx}"])


def list_overrides(overrides: Mapping[str, Any]) -> str:
    """`/set` alone through a server: only what was set (the rest is the server's)."""
    return ("\n".join(f"{k} = {v!r}" for k, v in overrides.items()) or
            "no parameters set: the server's defaults apply")


def param_names() -> list[str]:
    from infer.runtime.sampling import SamplingParams

    return [f.name for f in fields(SamplingParams) if not f.name.startswith("_")]


def _param_types() -> dict[str, str]:
    """Each sampling parameter's declared type, as written in SamplingParams."""
    from infer.runtime.sampling import SamplingParams

    return {f.name: str(f.type) for f in fields(SamplingParams)}


def _parse_value(kind: str, key: str, value: str) -> Any:
    """A /set value, read by the parameter's declared type ("none" clears an optional one)."""
    from infer.runtime.sampling import parse_logit_bias

    if kind.endswith("| None") and value.lower() in ("", "none"):
        return None
    kind = kind.removesuffix(" | None")
    parsers: dict[str, Any] = {
        "int": int, "float": float, "str": str,
        "bool": lambda v: {"1": True, "true": True, "on": True, "yes": True,
                           "0": False, "false": False, "off": False, "no": False}[v.lower()],
        "tuple[str, ...]": lambda v: (v,) if v else (),
        "tuple[tuple[int, float], ...]": lambda v: tuple(parse_logit_bias(x) for x in v.split()),
    }
    try:
        return parsers[kind](value)
    except (ValueError, KeyError):
        what = {"int": "a whole number", "float": "a number", "bool": "on or off"}.get(kind, "a value")
        raise UsageError(f"{key} needs {what}, not {value!r}") from None
