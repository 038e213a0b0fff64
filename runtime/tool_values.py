"""Argument values as chat templates print them, read back into JSON (issue 33): JSON itself,
Python's printing of it (``True``, ``None``, ``['x', 'y']``: templates that print a value with
``str()``), a template's own quote mark for strings inside (Gemma 4's ``<|"|>``), and XML's
CDATA wrapping of a string with special characters (MiniCPM)."""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from typing import Any

_OPEN, _CLOSE = "[{(", "]})"


def as_json(text: str, quote: str = "") -> str | None:
    """The JSON text of a printed value, or None where it is no JSON or Python literal."""
    text = text.strip()
    candidates = [text] + ([text.replace(quote, '"')] if quote and quote != '"' else [])
    for candidate in candidates:
        try:
            return json.dumps(json.loads(candidate), ensure_ascii=False)
        except ValueError:
            pass
    try:
        value: Any = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return None


_CDATA, _CDATA_END = "<![CDATA[", "]]>"


def unwrap_cdata(text: str, *, partial: bool = False) -> str:
    """A string without XML's CDATA wrapping; `partial`: of a string still being written, what
    is surely its text (nothing that may yet be the wrapping)."""
    if partial and _CDATA.startswith(text[:len(_CDATA)]) and len(text) < len(_CDATA):
        return ""
    if not text.startswith(_CDATA):
        return text
    if not partial:
        return text[len(_CDATA):-len(_CDATA_END)] if text.endswith(_CDATA_END) else text
    inner = text[len(_CDATA):]
    held = next((n for n in (3, 2, 1) if inner.endswith(_CDATA_END[:n])), 0)
    return inner[:len(inner) - held]


def literal_end(text: str, pos: int, quotes: tuple[str, ...], stop: Callable[[int], bool]) -> int | None:
    """Where a printed value that starts at `pos` ends: at the first place, outside quotes and
    brackets, where `stop` says the next thing begins, or at a closing bracket it did not open;
    None where the text ends first."""
    depth, inside, i = 0, "", pos
    while i < len(text):
        if inside:
            if text[i] == "\\":
                i += 2
                continue
            if text.startswith(inside, i):
                i, inside = i + len(inside), ""
                continue
            i += 1
            continue
        if depth == 0 and i > pos and stop(i):
            return i
        quote = next((q for q in quotes if q and text.startswith(q, i)), "")
        if quote:
            i, inside = i + len(quote), quote
            continue
        if text[i] in _OPEN:
            depth += 1
        elif text[i] in _CLOSE:
            if depth == 0:
                return i
            depth -= 1
        i += 1
    return None
