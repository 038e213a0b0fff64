"""A reply's text split, as it streams, into content and tool calls (issue 33): what a server
streams as `delta.content` and `delta.tool_calls`, and what `infer run --tools` prints.

Content passes through until the text could be the start of the calls' opening marker: that
part is held back until it is known. From the marker on, the calls are read (CallReader) and
each comes out as soon as its name is known, then its arguments in pieces. Text that turns
out not to be calls is given back as content; nothing is lost and no marker reaches the
content.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from infer.runtime.tool_calls import CallReader, ToolCall, string_params
from infer.runtime.tool_markers import FAIL, PARTIAL, Marker
from infer.runtime.tool_syntax import ToolSyntax


@dataclass(frozen=True)
class CallStarted:
    """Call `index` begins: its id and name."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ArgumentsPiece:
    """More of call `index`'s arguments (JSON text; the pieces add up to the whole)."""

    index: int
    text: str


Event = str | CallStarted | ArgumentsPiece  # (a str is content)


class ToolCallStream:
    """Feed a reply's text; get content and call events. `calls` holds the calls read so far;
    `single`: at most one call (`parallel_tool_calls: false`)."""

    def __init__(self, syntax: ToolSyntax, tools: Iterable[Mapping[str, Any]], *,
                 single: bool = False) -> None:
        self.syntax, self.single = syntax, single
        self.strings = string_params(tools)
        self.triggers = [(form, Marker(form.trigger)) for form in syntax.forms]  # (the calls' opening)
        self.pending = ""  # content that may be the start of the trigger
        self.buffer: str | None = None  # the text from the trigger on, while calls are read
        self.reader: CallReader | None = None
        self.calls: list[ToolCall] = []
        self._sent: list[int] = []  # of each call: how much of its arguments was given out
        self._base = 0  # the number of calls before the section being read
        self.opened = syntax.prompted  # the prompt wrote the start of the opening ("": the reply began)

    def feed(self, text: str) -> list[Event]:
        return self._advance(text, final=False)

    def finish(self) -> list[Event]:
        return self._advance("", final=True)

    def _advance(self, text: str, *, final: bool) -> list[Event]:
        events: list[Event] = []
        if self.buffer is None:
            self.pending += text
            if self.opened and not self._begin(final):
                return events
            if self.buffer is None:
                self._scan(events, final)
        else:
            self.buffer += text
        if self.buffer is not None:
            self._read(events, final)
        return events

    def _begin(self, final: bool) -> bool:
        """Where the prompt wrote the start of the calls' opening: whether the reply's start is
        known yet. A reply of text begins with the template's content lead (functionary's
        "all\\n", not content); any other is read as calls, from the rest of the opening on."""
        lead = self.syntax.content_lead
        if lead and len(self.pending) < len(lead) and lead.startswith(self.pending) and not final:
            return False
        if lead and self.pending.startswith(lead):
            self.pending = self.pending[len(lead):]
        else:
            self.buffer, self.pending = self.pending, ""
            self.reader = CallReader(self.syntax, self.strings, opened=self.opened)
        self.opened = ""
        return True

    def _scan(self, events: list[Event], final: bool) -> None:
        """Content up to the trigger (or to where the text may begin it)."""
        start, end, form = self._opening()
        if end == FAIL or (end == PARTIAL and final):
            content, self.pending = self.pending, ""
        else:
            content, self.buffer, self.pending = self.pending[:start], self.pending[start:], ""
            self.reader = CallReader(form, self.strings)  # (new ids for each section's calls)
        if content and not (self.calls and not content.strip()):
            events.append(content)

    def _opening(self) -> tuple[int, int, ToolSyntax]:
        """The first opening of calls in the pending text, in any form: (start, end, form), end
        PARTIAL where the text may end inside it, FAIL where there is none."""
        found = (-1, FAIL, self.syntax)
        for form, marker in self.triggers:
            start, end = marker.search(self.pending, 0) if marker else (-1, FAIL)
            if end != FAIL and (found[1] == FAIL or start < found[0]):
                found = (start, end, form)
        return found

    def _read(self, events: list[Event], final: bool) -> None:
        assert self.buffer is not None and self.reader is not None
        read = self.reader.read(self.buffer, final)
        calls = read.calls[:max(0, 1 - self._base)] if self.single else read.calls
        for n, call in enumerate(calls):
            index = self._base + n
            if index == len(self.calls):
                if not call.name:
                    break
                self.calls.append(call)
                self._sent.append(0)
                events.append(CallStarted(index, call.id, call.name))
            self.calls[index] = call
            piece = call.arguments[self._sent[index]:]
            if piece:
                events.append(ArgumentsPiece(index, piece))
                self._sent[index] = len(call.arguments)
        if read.failed:  # not calls after all (from the last whole one on): content
            rest = self.buffer[read.done_at:] if calls else self.buffer
            self.calls = [c for c in self.calls if c.done]
            self._finish_section(rest, events, final, scan=False)
        elif read.end is not None:
            self._finish_section(self.buffer[read.end:], events, final)

    def _finish_section(self, rest: str, events: list[Event], final: bool, *, scan: bool = True) -> None:
        self.buffer, self._base = None, len(self.calls)
        self._sent = self._sent[:len(self.calls)]
        if not scan:
            if rest:
                events.append(rest)
            return
        self.pending = rest
        self._scan(events, final)
        if self.buffer is not None:
            self._read(events, final)


def settle_calls(completion: Any, content: str, calls: Iterable[ToolCall]) -> Any:
    """Set a Completion's text to the content alone and its `tool_calls` (the whole calls, in
    OpenAI's shape); a reply that called ends for "tool_calls"."""
    whole = [call.as_openai() for call in calls if call.done]
    completion.text = content.strip() if whole else content
    completion.tool_calls = whole
    if whole and completion.finish_reason in ("eos", "stop"):
        completion.finish_reason = "tool_calls"
    return completion


def split_calls(completion: Any, syntax: ToolSyntax, request: Any) -> Any:
    """A whole Completion with the calls of `request` (runtime.tool_request.ToolRequest) apart
    (see `settle_calls`)."""
    stream = ToolCallStream(syntax, request.tools, single=not request.parallel)
    events = stream.feed(completion.text) + stream.finish()
    return settle_calls(completion, "".join(e for e in events if isinstance(e, str)), stream.calls)
