"""A reply in Ollama's shapes: /api/chat's `message` (content, `thinking`, `tool_calls` with
arguments as objects) or /api/generate's `response`, whole or as NDJSON lines (one object
per piece, `done: false`, then a last one with `done: true`, `done_reason` and the counts and
durations Ollama reports, in nanoseconds). A generation that fails after the stream began
ends it with an `{"error": ...}` line."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from typing import Any

from starlette.responses import StreamingResponse

from infer.server.mailbox import Mailbox
from infer.server.reply import Reply
from infer.server.streaming import Gone, OneChoice


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _calls(reply: Reply) -> list[dict[str, Any]]:
    out = []
    for call in reply.done_calls(0):
        try:
            arguments = json.loads(call.arguments) if call.arguments.strip() else {}
        except ValueError:
            arguments = {}
        out.append({"function": {"name": call.name, "arguments": arguments}})
    return out


def _end(reply: Reply, started: float) -> dict[str, Any]:
    """The last object's fields: why it ended, the token counts and the durations (ns)."""
    c = reply.first
    prefill_ns = int(c.timings.prefill_ms * 1e6) if c is not None else 0
    decode_ns = int(c.timings.decode_ms * 1e6) if c is not None else 0
    return {"done": True, "done_reason": "length" if reply.finish[0] == "length" else "stop",
            "total_duration": int((time.monotonic() - started) * 1e9), "load_duration": 0,
            "prompt_eval_count": reply.prompt_tokens, "prompt_eval_duration": prefill_ns,
            "eval_count": reply.completion_tokens, "eval_duration": decode_ns}


class Shape:
    """/api/chat's (`chat`) or /api/generate's shapes, as `generation.Shape` takes them."""

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.started = time.monotonic()

    def _piece(self, reply: Reply, content: str, thinking: str, calls: list[dict[str, Any]] | None = None,
               ) -> dict[str, Any]:
        head = {"model": reply.model, "created_at": _now()}
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = calls
            return {**head, "message": message}
        return {**head, "response": content, **({"thinking": thinking} if thinking else {})}

    def whole(self, reply: Reply) -> dict[str, Any]:
        calls = _calls(reply)
        content = reply.texts[0].strip() if calls else reply.texts[0]
        return {**self._piece(reply, content, reply.reasonings[0], calls), **_end(reply, self.started)}

    def stream(self, reply: Reply, mailbox: Mailbox, choices: int, gone: Gone) -> AsyncIterator[bytes]:
        return _lines(self, reply, mailbox, choices, gone)


async def _lines(shape: Shape, reply: Reply, mailbox: Mailbox, choices: int,
                 gone: Gone) -> AsyncIterator[bytes]:
    with OneChoice(reply, mailbox, choices, gone) as choice:
        while (pieces := await choice.next()) is not None:
            reasoning, content, _ = pieces
            if reasoning or content:
                yield line(shape._piece(reply, content, reasoning))
        if reply.error is not None:
            yield line({"error": reply.error})
            return
        calls = _calls(reply)
        if calls:  # (Ollama sends a reply's calls whole, in one object before the last)
            yield line(shape._piece(reply, "", "", calls))
        yield line({**shape._piece(reply, "", ""), **_end(reply, shape.started)})


def line(data: dict[str, Any]) -> bytes:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def ndjson_response(events: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(events, media_type="application/x-ndjson")

