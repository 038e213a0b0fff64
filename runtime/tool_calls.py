"""Tool calls read from a reply as it streams, in the syntax its chat template writes them
(runtime/tool_syntax.py) (issue 33).

Text before the calls is content; from the calls' first marker on nothing reaches the content
unless what follows turns out not to be a call (then it is given back as text, nothing lost).
Each call comes out as soon as its name is known, then its arguments as JSON text in pieces
that add up to the whole (OpenAI's stream of `tool_calls[i].function.arguments`): a JSON
object as the model writes it, or, for keys and values between markers, the JSON object they
make (a value the tool's schema calls a string, or one its marker says is a string, as a JSON
string; others as the JSON they are). Markers match with any white space where theirs is.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from infer.runtime.tool_markers import FAIL, PARTIAL, Marker, worded
from infer.runtime.tool_syntax import ID, ToolSyntax
from infer.runtime.tool_values import as_json, literal_end, unwrap_cdata


@dataclass
class ToolCall:
    """A call as it is read: its id, name and arguments as JSON text (whole once `done`)."""

    id: str
    name: str
    arguments: str = ""
    done: bool = False

    def as_openai(self) -> dict[str, Any]:
        function = {"name": self.name, "arguments": self.arguments}
        return {"id": self.id, "type": "function", "function": function}


@dataclass
class _Read:
    """What a parse of the text after the trigger found."""

    calls: list[ToolCall] = field(default_factory=list)
    end: int | None = None  # where the section ended (None: not yet)
    done_at: int = 0  # where the last whole call ended
    failed: bool = False  # the text is not calls of this syntax


def string_params(tools: Iterable[Mapping[str, Any]]) -> dict[str, set[str]]:
    """Each function's parameters whose schema type is a string (their values are written as is)."""
    out: dict[str, set[str]] = {}
    for tool in tools:
        fn = tool.get("function", tool)
        props = (fn.get("parameters") or {}).get("properties") or {}
        out[fn.get("name", "")] = {k for k, v in props.items()
                                   if isinstance(v, dict) and v.get("type") == "string"}
    return out


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


class _Partial(Exception):
    """The text ends before what is being read does."""


class _Fail(Exception):
    """The text is not what this syntax writes."""


_NAME = re.compile(r"[A-Za-z0-9_\-.]+")


class CallReader:
    """Reads the calls of one syntax from a text that starts with their opening marker; each
    reading reads the whole text again (a reply's calls are short), so that what is given out
    only grows."""

    def __init__(self, syntax: ToolSyntax, strings: Mapping[str, set[str]], *, opened: str = "") -> None:
        self.syntax, self.strings = syntax, strings
        # (`opened`: the start of the opening, which the prompt wrote and the text lacks)
        self.opening = Marker((syntax.section_open + syntax.call_open)[len(opened):])
        self.next_call = Marker(syntax.call_sep + syntax.call_open)
        self.call_close, self.section_close = Marker(syntax.call_close), Marker(syntax.section_close)
        self.name_close = Marker(syntax.name_close)
        lead = _NAME.match(syntax.name_close)  # (a close that goes on as a name would: Llama's ".call(")
        self.name_stop = lead.group() if lead else ""
        self.ids: list[str] = []  # an id for each call, kept from one reading to the next

    def read(self, text: str, final: bool) -> _Read:
        out = _Read()
        try:
            pos = self._expect(self.opening, text, 0, final)
            while True:
                pos = out.done_at = self._call(text, pos, out, final)
                if self.syntax.parallel:
                    more = self.next_call.match(text, pos)
                    if more >= 0 and not self.next_call:  # (JSON calls one after the other)
                        more = more if text[more:more + 1] == "{" and self.syntax.json_keys is not None else \
                            PARTIAL if more == len(text) else FAIL
                    if more >= 0:
                        pos = more
                        continue
                    if more == PARTIAL and not final and not (self.section_close and
                                                              self.section_close.match(text, pos) >= 0):
                        raise _Partial
                end = self.section_close.match(text, pos) if self.section_close else pos
                if end == PARTIAL and not final:
                    raise _Partial
                # (a reply may stop before the section's end, or inside it)
                out.end = end if end >= 0 else len(text) if end == PARTIAL else pos
                return out
        except _Partial:
            if final:
                out.failed = not out.calls or not out.calls[-1].done
            return out
        except _Fail:
            out.failed = True
            return out

    def _expect(self, marker: Marker, text: str, pos: int, final: bool,
                found: dict[str, str] | None = None) -> int:
        end = marker.match(text, pos, found)
        if end == PARTIAL:
            raise _Partial
        if end == FAIL:
            raise _Fail
        return end

    def _id(self, n: int, found: Mapping[str, str]) -> str:
        while len(self.ids) <= n:
            self.ids.append(new_call_id())
        return found.get("id") or self.ids[n]

    def _call(self, text: str, pos: int, out: _Read, final: bool) -> int:
        n = len(out.calls)
        if self.syntax.json_keys is not None:
            pos = self._json_call(text, pos, out, final)
            return self._expect(self.call_close, text, pos, final)
        while pos < len(text) and text[pos] in " \t":
            pos += 1
        m = _NAME.match(text, pos)
        if m is None:
            raise _Partial if pos >= len(text.rstrip()) else _Fail
        if m.end() == len(text) and not final:
            raise _Partial
        found: dict[str, str] = {}
        name = m.group().split(self.name_stop)[0] if self.name_stop else m.group()
        call = ToolCall("", name)
        pos = self._expect(self.name_close, text, m.start() + len(name), final, found)
        if not self.name_close and self.syntax.pairs is None:  # (white space alone: a call once its
            pos = _object_start(text, pos)  # arguments begin, not a word of text: functionary v3.2's)
        call.id = self._id(n, found)
        out.calls.append(call)
        if self.syntax.pairs is None:
            pos = self._json_arguments(text, pos, call)
        else:
            pos = _Pairs(self.syntax, self.strings.get(call.name, set())).read(text, pos, call, final)
        pos = self._expect(self.call_close, text, pos, final)
        call.done = True
        return pos

    def _json_arguments(self, text: str, pos: int, call: ToolCall) -> int:
        pos = _object_start(text, pos)
        try:
            _, end = json.JSONDecoder().raw_decode(text, pos)
        except ValueError:
            call.arguments = text[pos:]
            raise _Partial from None
        call.arguments = text[pos:end]
        return end

    def _json_call(self, text: str, pos: int, out: _Read, final: bool) -> int:
        name_key, args_key = self.syntax.json_keys or ("", "")
        pos = _object_start(text, pos)
        head = (r'\{\s*"([^"\\]+)"\s*:\s*' if not name_key else
                r'"' + re.escape(name_key) + r'"\s*:\s*"((?:[^"\\]|\\.)*)"')
        named = re.compile(head).search(text, pos)
        args_key_at = re.compile(r'"' + re.escape(args_key) + r'"\s*:\s*')
        args_at = args_key_at.search(text, pos) if args_key else named
        try:
            obj, end = json.JSONDecoder().raw_decode(text, pos)
        except ValueError:
            if final or named is None:
                raise _Partial from None
            obj, end = None, None
        if named is None or args_at is None:
            raise _Fail if final or end is not None else _Partial
        found = {}
        for key, value in self.syntax.extras:
            if value == ID and isinstance(obj, dict) and isinstance(obj.get(key), str):
                found["id"] = obj[key]
        call = ToolCall(self._id(len(out.calls), found), json.loads(f'"{named.group(1)}"'))
        out.calls.append(call)
        start = args_at.end()
        try:
            _, args_end = json.JSONDecoder().raw_decode(text, start)
            call.arguments = text[start:args_end]
        except ValueError:
            call.arguments = text[start:] if start < len(text) and text[start] == "{" else ""
            raise _Partial from None
        if end is None:
            raise _Partial
        call.done = True
        return end


def _object_start(text: str, pos: int) -> int:
    """Where the JSON object that must come next begins (after blank space)."""
    while pos < len(text) and text[pos].isspace():
        pos += 1
    if pos >= len(text):
        raise _Partial
    if text[pos] != "{":
        raise _Fail
    return pos


class _Pairs:
    """Arguments as keys and values between markers, read into a JSON object's text."""

    def __init__(self, syntax: ToolSyntax, strings: set[str]) -> None:
        assert syntax.pairs is not None
        self.p, self.strings = syntax.pairs, strings
        # (where each call has no end of its own, the calls' end ends the arguments: Llama's ")")
        self.call_close = Marker(syntax.call_close or syntax.section_close)
        self.first_key = Marker(self.p.before_key)
        self.next_key = Marker(self.p.sep + self.p.before_key)
        self.after_key = {kind: Marker(text) for kind, text in self.p.after_key.items()}
        self.kind_word, self.worded = worded(self.p.after_key["string"], self.p.after_key["other"])
        closing = self.p.after_value["string"]  # a mark around strings (Gemma's <|"|>, LFM2's ')
        self.quote = closing if closing.strip() and self.p.after_key["string"].endswith(closing) else ""
        self.after_value = {kind: Marker(text) for kind, text in self.p.after_value.items()}

    def read(self, text: str, pos: int, call: ToolCall, final: bool) -> int:
        parts: list[str] = []
        try:
            while True:
                close = self.call_close.match(text, pos)
                if close >= 0 or (close == PARTIAL and final):  # (a reply may stop inside the end)
                    break
                key_marker = self.next_key if parts else self.first_key
                at = key_marker.match(text, pos)
                if at == PARTIAL or (at == FAIL and close == PARTIAL):
                    raise _Partial
                if at == FAIL:
                    raise _Fail
                pos = self._pair(text, at, parts, final)
        finally:
            call.arguments = "{" + ", ".join(parts)
        call.arguments += "}"
        return pos

    def _pair(self, text: str, pos: int, parts: list[str], final: bool) -> int:
        m = _NAME.match(text, pos)
        if m is None or (m.end() == len(text) and not final):
            raise _Partial if m is not None or pos >= len(text) else _Fail
        key, pos = m.group(), m.end()
        kind, pos = self._kind(text, pos, key, final)
        head = json.dumps(key) + ": "
        if kind == "string":
            return self._string(text, pos, head, parts, final)
        return self._other(text, pos, head, parts, final)

    def _other(self, text: str, pos: int, head: str, parts: list[str], final: bool) -> int:
        """A value that is not a string: whole once it ends (JSON, or as the template prints it)."""
        marker = self.after_value["other"]
        if marker:
            start, end = marker.search(text, pos)
            if end < 0:
                if final:
                    raise _Fail
                raise _Partial
        else:  # (nothing marks its end: the next key or the call's end does, outside brackets)
            def stop(at: int) -> bool:
                return self.next_key.match(text, at) >= 0 or self.call_close.match(text, at) >= 0

            found = literal_end(text, pos, ('"', "'", self.quote), stop)
            if found is None:
                if not final:
                    raise _Partial
                found = len(text)
            start = end = found
        value = text[pos:start]
        printed = as_json(value, self.quote)
        parts.append(head + (printed if printed is not None else json.dumps(unwrap_cdata(value.strip()),
                                                                             ensure_ascii=False)))
        return end

    def _kind(self, text: str, pos: int, key: str, final: bool) -> tuple[str, int]:
        if self.worded is not None:
            found: dict[str, str] = {}
            end = self.worded.match(text, pos, found)
            if end < 0:
                raise _Partial if end == PARTIAL else _Fail
            return ("string" if found.get("word") == self.kind_word else "other"), end
        ends = {kind: marker.match(text, pos) for kind, marker in self.after_key.items()}
        if self.p.after_key["string"] == self.p.after_key["other"]:
            if ends["string"] == PARTIAL:
                raise _Partial
            if ends["string"] == FAIL:
                raise _Fail
            return ("string" if key in self.strings else "other"), ends["string"]
        if ends["string"] >= 0:
            return "string", ends["string"]
        if ends["string"] == PARTIAL and not final:
            raise _Partial
        if ends["other"] >= 0:
            return "other", ends["other"]
        raise _Partial if ends["other"] == PARTIAL else _Fail

    def _string(self, text: str, pos: int, head: str, parts: list[str], final: bool,
                kind: str = "string") -> int:
        marker = self.after_value[kind]
        start, end = marker.search(text, pos)
        value = text[pos:start if start >= 0 else len(text)]
        if self.p.after_key[kind][-1:].isspace() and value.startswith("\n"):
            value = value[1:]
        trailing = self.p.after_value[kind][:1].isspace()
        if end >= 0:
            if trailing and value.endswith("\n"):
                value = value[:-1]
            parts.append(head + json.dumps(unwrap_cdata(value), ensure_ascii=False))
            return end
        if final:
            raise _Fail
        if trailing and value.endswith("\n"):
            value = value[:-1]  # (maybe the start of the marker)
        parts.append(head + json.dumps(unwrap_cdata(value, partial=True), ensure_ascii=False)[:-1])
        raise _Partial

