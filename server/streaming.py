"""A streamed reply: its chunks as server-sent events, ended by ``data: [DONE]``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import StreamingResponse

from infer.runtime.request import Delta, Outcome
from infer.server.mailbox import Mailbox
from infer.server.reply import Reply

Gone = Callable[[int, list[tuple[int, Delta | Outcome]]], None]
Pieces = tuple[str, str, list[Any]]  # reasoning, content, tool-call events (Reply.pieces)


def sse_response(events: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def stream(reply: Reply, mailbox: Mailbox, choices: int, gone: Gone) -> AsyncIterator[bytes]:
    """The events of `choices` choices as the mailbox receives them; if the client goes away
    first, `gone` is told how many choices had not ended and what was taken but not sent."""
    ended = 0
    taken: list[tuple[int, Delta | Outcome]] = []  # from the mailbox, not sent yet
    try:
        for i in range(choices):
            if reply.gen.chat:
                yield sse(reply.chunk(i, {"role": "assistant", "content": ""}))
        while ended < choices:
            taken = taken or await mailbox.take()
            choice, item = taken.pop(0)
            if isinstance(item, Delta):
                for chunk in reply.delta_chunks(choice, item):
                    yield sse(chunk)
            else:
                ended += 1
                for chunk in reply.end_chunks(choice, item):
                    yield sse(chunk)
        if reply.gen.include_usage:
            yield sse(reply.usage_chunk())
        yield b"data: [DONE]\n\n"
    finally:
        if ended < choices:  # the client went away
            gone(choices - ended, taken)


class OneChoice:
    """The pieces of a reply's one choice as the mailbox receives them, for a front end that
    streams them in a shape of its own (Anthropic, Responses, Ollama, /infill). Used as a
    context: leaving it before the choice ended (the client went away) tells `gone`, as
    `stream` does for OpenAI's chunks.

        with OneChoice(reply, mailbox, choices, gone) as choice:
            ...  # the stream's opening events
            while (pieces := await choice.next()) is not None:
                ...
    """

    def __init__(self, reply: Reply, mailbox: Mailbox, choices: int, gone: Gone) -> None:
        self.reply, self.mailbox, self.choices, self.gone = reply, mailbox, choices, gone
        self.ended = False
        self.taken: list[tuple[int, Delta | Outcome]] = []  # from the mailbox, not given yet

    async def next(self) -> Pieces | None:
        """The next delta's pieces, then what the end flushed; None after the end."""
        if self.ended:
            return None
        self.taken = self.taken or await self.mailbox.take()
        _, item = self.taken.pop(0)
        if isinstance(item, Delta):
            return self.reply.pieces(0, item)
        self.ended = True
        return self.reply.end_pieces(0, item)

    def __enter__(self) -> OneChoice:
        return self

    def __exit__(self, *_: object) -> None:
        if not self.ended:  # the client went away
            self.gone(self.choices, self.taken)


def sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"
