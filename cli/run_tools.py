"""`infer run --tools FILE [--tool-choice auto|none|required|NAME]` (issue 33): the tools given
to the chat template, the reply read for calls in the syntax the template writes them, and each
call printed on stdout as one JSON line, `{"name": …, "arguments": {…}}`, after the reply's
text (so a shell script can dispatch it); with --json, `tool_calls` in OpenAI's shape."""

from __future__ import annotations

import json
import sys

from infer.runtime.errors import FieldError, UsageError

TYPE_CHECKING = False  # (typing costs infer run's start-up: cli/main.py)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


def tool_request(flags: Mapping[str, Any]) -> Any:
    """--tools and --tool-choice checked (runtime.tool_request.ToolRequest), or None."""
    from infer.cli.flags import read_text_file
    from infer.runtime.tool_request import parse_tools

    raw, choice = flags.get("tools"), flags.get("tool_choice")
    if raw is None:
        if choice is not None:
            raise UsageError("--tool-choice needs --tools")
        return None
    text = read_text_file(raw[1:], "tools file") if raw.startswith("@") else raw
    try:
        tools = json.loads(text)
    except ValueError as e:
        raise UsageError(f"--tools is not valid JSON: {e}") from None
    body: dict[str, Any] = {"tools": tools}
    if choice is not None:
        body["tool_choice"] = _choice_field(choice)
    try:
        return parse_tools(body)
    except FieldError as e:
        flag = "--tool-choice" if e.field == "tool_choice" else "--tools"
        raise UsageError(f"{flag}: {e}") from None


class CallReply:
    """A reply's text split as it streams into content (to the reply it wraps) and tool calls,
    which `settle` puts in the Completion."""

    def __init__(self, reply: Any, syntax: Any, request: Any) -> None:
        from infer.runtime.tool_stream import ToolCallStream

        self.reply, self.content = reply, ""
        self.stream = ToolCallStream(syntax, request.tools, single=not request.parallel)

    @property
    def thinking_s(self) -> float | None:
        return self.reply.thinking_s

    def piece(self, text: str) -> None:
        self._content(self.stream.feed(text))

    def reasoning(self, text: str) -> None:
        self.reply.reasoning(text)

    def end(self) -> None:
        self._content(self.stream.finish())
        self.reply.end()

    def _content(self, events: list[Any]) -> None:
        for event in events:
            if isinstance(event, str):
                self.content += event
                self.reply.piece(event)

    def settle(self, completion: Any) -> None:
        from infer.runtime.tool_stream import settle_calls

        settle_calls(completion, self.content, self.stream.calls)


def print_calls(calls: list[dict[str, Any]]) -> None:
    """Each call as one JSON line on stdout, `{"name": …, "arguments": {…}}`."""
    for call in calls:
        sys.stdout.write(json.dumps({"name": call["function"]["name"], "arguments": _arguments(call)},
                                    ensure_ascii=False) + "\n")
    sys.stdout.flush()


def expect_calls(completion: Any, request: Any) -> None:
    """A server's reply to a request whose reply may call tools has `tool_calls` ([] where it
    made none), as a local one does."""
    if request is not None and request.active and completion.tool_calls is None:
        completion.tool_calls = []


def request_fields(request: Any) -> dict[str, Any]:
    """A ToolRequest as the fields of a chat request to a server."""
    choice = _choice_field(request.name if request.choice == "function" else request.choice)
    return {"tools": list(request.tools), "tool_choice": choice, "parallel_tool_calls": request.parallel}


def _choice_field(choice: str) -> Any:
    """A --tool-choice (auto, none, required, or a tool's name) as the request field."""
    keyword = choice in ("auto", "none", "required")
    return choice if keyword else {"type": "function", "function": {"name": choice}}


def _arguments(call: Mapping[str, Any]) -> Any:
    try:
        return json.loads(call["function"]["arguments"])
    except ValueError:
        return call["function"]["arguments"]
