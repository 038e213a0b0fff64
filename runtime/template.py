"""Chat templates: render a conversation with the model's Jinja template, sandboxed.

A template comes from a downloaded file, so it is untrusted input. It runs in
Jinja's immutable sandbox, and any reach for Python internals (an underscore
attribute, an unsafe call) stops rendering with a ``TemplateError`` instead of
quietly rendering nothing. The environment offers what real templates call, as
Hugging Face's ``apply_chat_template`` does.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from infer.runtime.errors import TemplateError

Message = dict[str, Any]


class _TemplateRaised(TemplateError):
    """The template itself called raise_exception (it refuses this conversation)."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(f"the chat template refused the conversation: {message}")


def _tojson(value: Any, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False, ensure_ascii: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys, default=_listed)


def _listed(value: Any) -> list[Any]:
    """What Jinja's filters return lazily (`tools | map(attribute='function')`: a generator),
    as the list minja and llama.cpp's templates take it for (DeepSeek R1's)."""
    if isinstance(value, Iterator):
        return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training; render as is."""

    tags = {"generation"}  # noqa: RUF012 - Jinja's Extension declares it so

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


# The lists a render was given (its messages, tools...), by id: they stay as they are
_GIVEN: ContextVar[frozenset[int]] = ContextVar("given_lists", default=frozenset())


class _StrictSandbox(ImmutableSandboxedEnvironment):
    """A sandbox where touching an unsafe attribute is an error, not an empty string. A list the
    template made may grow (`ns.ids.append(x)`: Kimi K2 Thinking's tool results; minja allows
    it); nothing it was given may change."""

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        if isinstance(obj, list) and attr in ("append", "extend") and id(obj) not in _GIVEN.get():
            return True
        return super().is_safe_attribute(obj, attr, value)

    def unsafe_undefined(self, obj: Any, attribute: Any) -> Any:
        raise SecurityError(
            f"access to attribute {attribute!r} of a {type(obj).__name__} is not allowed"
        )


def _lists(value: Any, found: set[int]) -> set[int]:
    """The ids of the lists in `value`, at any depth."""
    if isinstance(value, list):
        found.add(id(value))
    if isinstance(value, Mapping):
        value = value.values()
    if isinstance(value, (list, tuple, type({}.values()))):
        for item in value:
            _lists(item, found)
    return found


class _SourceLoader(jinja2.BaseLoader):
    """Templates by the hash of their source, so Jinja's bytecode cache can key on it."""

    def __init__(self) -> None:
        self.sources: dict[str, str] = {}

    def get_source(self, environment: Any, name: str) -> tuple[str, None, Callable[[], bool]]:
        return self.sources[name], None, lambda: True


_cache_dir: Path | None = None


def use_compiled_cache(directory: Path | None) -> None:
    """Keep compiled templates in `directory`, so that each process does not compile again.

    Compiling a real chat template takes 10-30 ms, a noticeable share of a one-shot run.
    """
    global _cache_dir
    _cache_dir = directory
    _environment.cache_clear()
    _compile.cache_clear()


@lru_cache(maxsize=1)
def _environment() -> _StrictSandbox:
    cache = None
    if _cache_dir is not None:
        try:
            _cache_dir.mkdir(parents=True, exist_ok=True)
            cache = jinja2.FileSystemBytecodeCache(str(_cache_dir))
        except OSError:
            cache = None  # an unwritable cache folder only costs compile time
    env = _StrictSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=["jinja2.ext.loopcontrols", _GenerationTag],
        loader=_SourceLoader(),
        bytecode_cache=cache,
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    env = _environment()
    name = hashlib.sha256(source.encode("utf-8")).hexdigest()
    env.loader.sources[name] = source  # type: ignore[union-attr]
    try:
        return env.get_template(name)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"the chat template has a syntax error on line {e.lineno}: {e.message}") from None
    except SecurityError as e:
        raise TemplateError(f"the chat template tried something not allowed: {e}") from None


def render(source: str, messages: Sequence[Message], *, bos_token: str = "", eos_token: str = "",
           add_generation_prompt: bool = True, variables: Mapping[str, Any] | None = None) -> str:
    """Render `messages` with the template `source` (and its own `variables`, such as
    `enable_thinking`: llama-server's chat_template_kwargs).

    System messages after the first place (agents send them mid-conversation: Claude Code
    does) stay where they are if the template renders them there; where it refuses or drops
    them, they are joined into the system prompt. If the template refuses a system message at
    all, the system prompt is merged into the first user message and rendering tried again.
    """
    template = _compile(source)
    args = (bos_token, eos_token, add_generation_prompt, variables or {})
    folded = fold_later_system(messages)
    if folded is not None:
        try:
            text = _render(template, messages, *args)
            later = [str(m.get("content") or "").strip() for m in messages[1:] if m.get("role") == "system"]
            if all(t in text for t in later):
                return text
        except _TemplateRaised:
            pass
        messages = folded
    try:
        return _render(template, messages, *args)
    except _TemplateRaised:
        merged = merge_system_into_user(messages)
        if merged is None:
            raise
        return _render(template, merged, *args)


def _render(template: jinja2.Template, messages: Sequence[Message], bos_token: str,
            eos_token: str, add_generation_prompt: bool, variables: Mapping[str, Any]) -> str:
    given = [dict(m) for m in messages]
    token = _GIVEN.set(frozenset(_lists([given, *variables.values()], set())))
    try:
        return template.render(
            **variables,
            messages=given,
            bos_token=bos_token,
            eos_token=eos_token,
            add_generation_prompt=add_generation_prompt,
        )
    except TemplateError:
        raise
    except SecurityError as e:
        raise TemplateError(f"the chat template tried something not allowed: {e}") from None
    except jinja2.TemplateError as e:
        raise TemplateError(f"the chat template failed: {e}") from None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError) as e:
        raise TemplateError(f"the chat template failed: {type(e).__name__}: {e}") from None
    except RecursionError:
        raise TemplateError("the chat template recursed too deeply") from None
    finally:
        _GIVEN.reset(token)


def fold_later_system(messages: Sequence[Message]) -> list[Message] | None:
    """The conversation with its system messages after the first place joined, in order, into
    one system prompt first; None if it has none there."""
    later = [m for m in messages[1:] if m.get("role") == "system"]
    if not later:
        return None
    first = [messages[0]] if messages[0].get("role") == "system" else []
    system = "\n\n".join(str(m.get("content") or "") for m in first + later)
    rest = [m for m in messages[len(first):] if m.get("role") != "system"]
    return [{"role": "system", "content": system}, *rest]


def merge_system_into_user(messages: Sequence[Message]) -> list[Message] | None:
    """The conversation with its system prompt prepended to the first user message."""
    if not messages or messages[0].get("role") != "system":
        return None
    system, rest = messages[0], [dict(m) for m in messages[1:]]
    for m in rest:
        if m.get("role") == "user":
            m["content"] = f"{system['content']}\n\n{m['content']}"
            return rest
    return [{"role": "user", "content": system["content"]}, *rest]
