"""A reply in OpenAI's Responses shapes: the response object, or its stream of events
(`response.created`, `response.in_progress`, then for each output item
`response.output_item.added` / `.done` around its content: `response.content_part.added` /
`.done` and `response.output_text.delta` / `.done` for a message, `response.reasoning_text.delta`
/ `.done` for reasoning, `response.function_call_arguments.delta` / `.done` for a call; last
`response.completed`, `response.incomplete` (the token limit ended it) or `response.failed`),
every event with its `sequence_number`.

The output is what `Reply` read from the model: its reasoning as a `reasoning` item, its text
as a `message` item, its tool calls as `function_call` items. A message that would hold only
white space (before a call) is left out, whole and streamed alike. A completed or incomplete
response is kept in the `ResponseStore` unless the request said `store: false`.
"""

from __future__ import annotations

import functools
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from infer.runtime.tool_stream import ArgumentsPiece, CallStarted
from infer.server.generation import Shape
from infer.server.mailbox import Mailbox
from infer.server.reply import Reply
from infer.server.response_store import ResponseStore, Stored
from infer.server.responses import Asked
from infer.server.streaming import Gone, OneChoice


def shape(asked: Asked, store: ResponseStore) -> Shape:
    """How the reply to `asked` is written (and kept in `store`)."""
    return Shape(functools.partial(stream, asked, store), functools.partial(whole, asked, store))


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _status(reply: Reply) -> str:
    c = reply.first
    return "incomplete" if c is not None and c.finish_reason in ("length", "cancelled") else "completed"


def _usage(reply: Reply) -> dict[str, Any]:
    return {"input_tokens": reply.prompt_tokens,
            "input_tokens_details": {"cached_tokens": reply.cached_tokens},
            "output_tokens": reply.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": reply.reasoning_tokens},
            "total_tokens": reply.prompt_tokens + reply.completion_tokens}


def _response(asked: Asked, reply: Reply, output: list[dict[str, Any]], status: str) -> dict[str, Any]:
    """The response object around `output` (in progress: no usage yet)."""
    done = status in ("completed", "incomplete")
    return {"id": "resp_" + reply.id.rsplit("-", 1)[-1], "object": "response", "created_at": reply.created,
            "status": status, "completed_at": int(time.time()) if status == "completed" else None,
            "background": False, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "model": reply.model, "output": output, **asked.echo, "usage": _usage(reply) if done else None}


def _item(kind: str, item_id: str, text: str, status: str,
          call: tuple[str, str] = ("", "")) -> dict[str, Any]:
    """An output item whole: reasoning, a message or a function call (`call`: its id and name)."""
    if kind == "reasoning":
        return {"type": "reasoning", "id": item_id, "summary": [],
                "content": [{"type": "reasoning_text", "text": text}]}
    if kind == "message":
        return {"type": "message", "id": item_id, "status": status, "role": "assistant",
                "content": [_part(kind, text)]}
    return {"type": "function_call", "id": item_id, "call_id": call[0], "name": call[1], "arguments": text,
            "status": status}


def _part(kind: str, text: str) -> dict[str, Any]:
    if kind == "reasoning":
        return {"type": "reasoning_text", "text": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _assistant(reply: Reply) -> dict[str, Any]:
    """The reply as the assistant message of the conversation it continues."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.texts[0]}
    if reply.reasonings[0]:
        message["reasoning_content"] = reply.reasonings[0]
    calls = reply.done_calls(0)
    if calls:
        message["tool_calls"] = [c.as_openai() for c in calls]
    return message


def _finish(asked: Asked, store: ResponseStore, reply: Reply, output: list[dict[str, Any]]) -> dict[str, Any]:
    """The ended response, kept in the store if the request asked for it."""
    body = _response(asked, reply, output, _status(reply))
    if asked.store:
        store.put(Stored(body, (*asked.messages, _assistant(reply)), asked.previous))
    return body


def whole(asked: Asked, store: ResponseStore, reply: Reply) -> dict[str, Any]:
    output = []
    if reply.reasonings[0]:
        output.append(_item("reasoning", _new_id("rs"), reply.reasonings[0], "completed"))
    calls = reply.done_calls(0)
    if reply.texts[0].strip() or not calls:
        output.append(_item("message", _new_id("msg"), reply.texts[0], "completed"))
    output += [_item("function_call", _new_id("fc"), c.arguments, "completed", (c.id, c.name)) for c in calls]
    if _status(reply) == "incomplete":
        output[-1]["status"] = "incomplete"
    return _finish(asked, store, reply, output)


class _Items:
    """The output items of a streamed response: the one open, those done, and the events
    that open, extend and close them."""

    def __init__(self) -> None:
        self.sequence = 0
        self.output: list[dict[str, Any]] = []  # the items done
        self.kind: str | None = None  # the open item's type
        self.id, self.text, self.call = "", "", ("", "")  # the open item's id, text so far, call
        self.pending = ""  # white space not sent yet (a message may never follow)
        self.said = self.called = False  # whether a message, a call was opened

    def event(self, kind: str, **fields: Any) -> bytes:
        data = json.dumps({"type": kind, "sequence_number": self.sequence, **fields}, ensure_ascii=False,
                          separators=(",", ":"))
        self.sequence += 1
        return f"event: {kind}\ndata: {data}\n\n".encode()

    def _at(self) -> dict[str, Any]:
        return {"item_id": self.id, "output_index": len(self.output)}

    def _open(self, kind: str, prefix: str, call: tuple[str, str] = ("", "")) -> list[bytes]:
        out = self.close("completed")
        self.kind, self.id, self.text, self.call = kind, _new_id(prefix), "", call
        self.said |= kind == "message"
        self.called |= kind == "function_call"
        item = _item(kind, self.id, "", "in_progress", call)
        if "content" in item:
            item["content"] = []
        out.append(self.event("response.output_item.added", output_index=len(self.output), item=item))
        if kind != "function_call":
            out.append(self.event("response.content_part.added", **self._at(), content_index=0,
                                  part=_part(kind, "")))
        return out

    def _delta(self, kind: str, text: str, **fields: Any) -> bytes:
        self.text += text
        return self.event(kind, **self._at(), **fields, delta=text)

    def close(self, status: str) -> list[bytes]:
        if self.kind is None:
            return []
        item = _item(self.kind, self.id, self.text, status, self.call)
        if self.kind == "function_call":
            out = [self.event("response.function_call_arguments.done", **self._at(), name=self.call[1],
                              arguments=self.text)]
        else:
            name = "response.output_text.done" if self.kind == "message" else "response.reasoning_text.done"
            extra = {"logprobs": []} if self.kind == "message" else {}
            out = [self.event(name, **self._at(), content_index=0, text=self.text, **extra),
                   self.event("response.content_part.done", **self._at(), content_index=0,
                              part=item["content"][0])]
        out.append(self.event("response.output_item.done", output_index=len(self.output), item=item))
        self.output.append(item)
        self.kind = None
        return out

    def add(self, reasoning: str, content: str, calls: list[Any]) -> list[bytes]:
        out: list[bytes] = []
        if reasoning:
            if self.kind != "reasoning":
                out += self._open("reasoning", "rs")
            out.append(self._delta("response.reasoning_text.delta", reasoning, content_index=0))
        if content:
            if self.kind != "message" and not (self.pending + content).strip():
                self.pending += content
            else:
                if self.kind != "message":
                    out += self._open("message", "msg")
                out.append(self._delta("response.output_text.delta", self.pending + content, content_index=0,
                                       logprobs=[]))
                self.pending = ""
        for e in calls:
            if isinstance(e, CallStarted):
                self.pending = ""
                out += self._open("function_call", "fc", (e.id, e.name))
            elif isinstance(e, ArgumentsPiece) and e.text:
                out.append(self._delta("response.function_call_arguments.delta", e.text))
        return out

    def finish(self, status: str) -> list[bytes]:
        """The last item closed; a message (if only of white space) where there was no text and
        no call, as the whole response has."""
        out: list[bytes] = []
        if not self.said and not self.called:
            out += self._open("message", "msg")
            if self.pending:
                out.append(self._delta("response.output_text.delta", self.pending, content_index=0,
                                       logprobs=[]))
        return out + self.close(status)


async def stream(asked: Asked, store: ResponseStore, reply: Reply, mailbox: Mailbox, choices: int,
                 gone: Gone) -> AsyncIterator[bytes]:
    """The events of the reply's one choice as the mailbox receives them."""
    items = _Items()
    with OneChoice(reply, mailbox, choices, gone) as choice:
        start = _response(asked, reply, [], "in_progress")
        yield items.event("response.created", response=start)
        yield items.event("response.in_progress", response=start)
        while (pieces := await choice.next()) is not None:
            for chunk in items.add(*pieces):
                yield chunk
        if reply.error is not None:
            failed = {**_response(asked, reply, items.output, "failed"),
                      "error": {"code": "server_error", "message": reply.error}}
            yield items.event("response.failed", response=failed)
            return
        status = _status(reply)
        for chunk in items.finish(status):
            yield chunk
        yield items.event(f"response.{status}", response=_finish(asked, store, reply, items.output))
