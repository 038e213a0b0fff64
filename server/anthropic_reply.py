"""A reply in Anthropic's Messages shapes: the whole message, or its stream of events
(`message_start`, `content_block_start` / `_delta` / `_stop` for each thinking, text and
tool_use block, `message_delta` with the stop reason and usage, `message_stop`; `ping`
after the start; an `error` event if the generation fails after the stream began).

The content is what `Reply` read from the model: its reasoning as a thinking block, its
text, its tool calls as tool_use blocks (`input` the arguments' object). A text block that
would hold only white space (before a call) is left out, whole and streamed alike.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from infer.runtime.tool_stream import ArgumentsPiece, CallStarted
from infer.server.mailbox import Mailbox
from infer.server.reply import Reply
from infer.server.streaming import Gone, OneChoice

_STOP = {"eos": "end_turn", "stop": "stop_sequence", "length": "max_tokens", "cancelled": "max_tokens"}


def _id(reply: Reply) -> str:
    return "msg_" + reply.id.rsplit("-", 1)[-1]


def _stop(reply: Reply) -> tuple[str, str | None]:
    """The stop reason and the stop sequence that ended the reply."""
    if reply.done_calls(0):
        return "tool_use", None
    c = reply.first
    if c is None:
        return "end_turn", None
    reason = _STOP.get(c.finish_reason, "end_turn")
    return reason, c.stop_string if reason == "stop_sequence" else None


def _usage(reply: Reply, *, output: bool = True) -> dict[str, Any]:
    """Anthropic counts the prompt's tokens read from a cache apart from the input's."""
    usage = {"input_tokens": reply.prompt_tokens - reply.cached_tokens, "cache_creation_input_tokens": 0,
             "cache_read_input_tokens": reply.cached_tokens}
    return {**usage, "output_tokens": reply.completion_tokens if output else 0}


def _head(reply: Reply) -> dict[str, Any]:
    return {"id": _id(reply), "type": "message", "role": "assistant", "model": reply.model}


def whole(reply: Reply) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if reply.reasonings[0]:
        content.append({"type": "thinking", "thinking": reply.reasonings[0], "signature": ""})
    if reply.texts[0].strip():
        content.append({"type": "text", "text": reply.texts[0]})
    content += [_tool_use(c.id, c.name, c.arguments) for c in reply.done_calls(0)]
    reason, sequence = _stop(reply)
    return {**_head(reply), "content": content, "stop_reason": reason, "stop_sequence": sequence,
            "usage": _usage(reply)}


def _tool_use(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        value = {}
    return {"type": "tool_use", "id": call_id, "name": name, "input": value}


def event(name: str, data: dict[str, Any]) -> bytes:
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {name}\ndata: {text}\n\n".encode()


class _Blocks:
    """The content blocks of a streamed message: which one is open, and the events that open,
    extend and close them."""

    def __init__(self) -> None:
        self.index = -1
        self.kind: str | None = None  # the open block's type
        self.pending = ""  # white space not sent yet (a text block may never follow)

    def _open(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        out = self.close()
        self.index += 1
        self.kind = kind
        start = {"type": "content_block_start", "index": self.index, "content_block": block}
        return [*out, event("content_block_start", start)]

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return event("content_block_delta",
                     {"type": "content_block_delta", "index": self.index, "delta": delta})

    def close(self) -> list[bytes]:
        if self.kind is None:
            return []
        self.kind = None
        return [event("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def add(self, reasoning: str, content: str, calls: list[Any]) -> list[bytes]:
        out: list[bytes] = []
        if reasoning:
            if self.kind != "thinking":
                out += self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out.append(self._delta({"type": "thinking_delta", "thinking": reasoning}))
        if content:
            if self.kind != "text" and not (self.pending + content).strip():
                self.pending += content
            else:
                if self.kind != "text":
                    out += self._open("text", {"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": self.pending + content}))
                self.pending = ""
        for e in calls:
            if isinstance(e, CallStarted):
                self.pending = ""
                out += self._open("tool_use", {"type": "tool_use", "id": e.id, "name": e.name, "input": {}})
            elif isinstance(e, ArgumentsPiece) and e.text:
                out.append(self._delta({"type": "input_json_delta", "partial_json": e.text}))
        return out


async def stream(reply: Reply, mailbox: Mailbox, choices: int, gone: Gone) -> AsyncIterator[bytes]:
    """The events of the reply's one choice as the mailbox receives them."""
    blocks = _Blocks()
    with OneChoice(reply, mailbox, choices, gone) as choice:
        start = {**_head(reply), "content": [], "stop_reason": None, "stop_sequence": None,
                 "usage": _usage(reply, output=False)}
        yield event("message_start", {"type": "message_start", "message": start})
        yield event("ping", {"type": "ping"})
        while (pieces := await choice.next()) is not None:
            for chunk in blocks.add(*pieces):
                yield chunk
        for chunk in blocks.close():
            yield chunk
        if reply.error is not None:
            yield event("error", {"type": "error", "error": {"type": "api_error", "message": reply.error}})
            return
        reason, sequence = _stop(reply)
        yield event("message_delta", {"type": "message_delta",
                                      "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                      "usage": _usage(reply)})
        yield event("message_stop", {"type": "message_stop"})
