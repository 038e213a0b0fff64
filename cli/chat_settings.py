"""`/set` in `infer chat`: a sampling parameter (or the context size) read from what the
user typed, and the listing of `/set` alone."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infer.runtime.errors import UsageError
from infer.runtime.request_params import PARAMS, SAMPLING, set_value

# What /set changes: the sampling parameters, and how the chat prompt is rendered (think,
# chat-template-kwargs, reasoning-budget: checked as their flags are, cli/flags.thinking_request).
_SETTABLE = {name: p for name, p in PARAMS.items() if p.group in ("sampling", "prompt")}
PROMPT_SETTINGS = tuple(name for name, p in PARAMS.items() if p.group == "prompt")

# The context size's names; a request parameter is also named by its long flags ("temp",
# "max-tokens", "mirostat-lr"), from runtime/request_params.py's table.
_CTX_NAMES = ("ctx", "num_ctx", "ctx-size", "ctx_size")
_LIST_HINT = " (/set alone lists them)"


def _field(key: str) -> str:
    if key in _CTX_NAMES:
        return "ctx"
    for p in _SETTABLE.values():
        if key in (f.lstrip("-") for f in p.flags if f.startswith("--")):
            return p.field
    return key.replace("-", "_")


def parse_setting(arg: str, *, hint: str = _LIST_HINT, no_ctx: str | None = None) -> dict[str, Any]:
    """`/set PARAM VALUE` read into the one override it makes, {name: value}: a sampling
    parameter in SamplingParams' spelling, or "ctx" for the context size. `hint` follows the
    error for an unknown name; `no_ctx`, where the context is not the chat's to set, is the
    error `/set ctx` gets."""
    key, _, value = arg.partition(" ")
    value = value.strip()
    key = _field(key)
    if key == "ctx":
        if no_ctx is not None:
            raise UsageError(no_ctx)
        return {key: _parse(key, "int", lambda: int(value), value)}
    if key not in _SETTABLE:
        raise UsageError(f"unknown parameter {key!r}{hint}")
    return {key: _parse(key, _SETTABLE[key].kind, lambda: set_value(_SETTABLE[key], value), value)}


def list_settings(params: Any, n_ctx: int, prompt: Mapping[str, Any]) -> str:
    """`/set` alone with the model loaded here: every sampling parameter, the thinking
    settings (`prompt`), then the context size."""
    return "\n".join([f"{n} = {getattr(params, n)!r}" for n in param_names()]
                     + [f"{n} = {prompt.get(n)!r}" for n in PROMPT_SETTINGS] + [f"ctx = {n_ctx}"])


def list_overrides(overrides: Mapping[str, Any]) -> str:
    """`/set` alone through a server: only what was set (the rest is the server's)."""
    return ("\n".join(f"{k} = {v!r}" for k, v in overrides.items()) or
            "no parameters set: the server's defaults apply")


def param_names() -> list[str]:
    return list(SAMPLING)


def _parse(key: str, kind: str, read: Any, value: str) -> Any:
    """A /set value read by `read`, or the error that says what `key` needs."""
    try:
        return read()
    except ValueError:
        what = {"int": "a whole number", "float": "a number", "bool": "on or off"}.get(kind, "a value")
        raise UsageError(f"{key} needs {what}, not {value!r}") from None
