"""OpenAI's chat and completions requests over the engines' continuous batch.

Each request is checked in `schema`, its prompt rendered and tokenized off the event
loop (`prepare`), and its choices submitted to the model's engine. What the engine's thread
produces reaches the request's handler through a `Mailbox`. A client that goes away has its
choices cancelled: their slots are free at the next step.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any, NamedTuple

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response

from infer.runtime.engine import Busy, Closed
from infer.runtime.request import Delta, Outcome, Request
from infer.runtime.sampling import SamplingParams
from infer.runtime.thinking import ThinkingPlan
from infer.server import schema
from infer.server.config import Config
from infer.server.errors import ApiError, busy
from infer.server.incoming import disconnected, read_body
from infer.server.mailbox import Mailbox
from infer.server.metrics import Metrics
from infer.server.models import ModelPool, Served
from infer.server.prepare import prepare
from infer.server.reply import Reply
from infer.server.streaming import Gone, sse_response, stream


class Shape(NamedTuple):
    """How an API writes a reply: its stream of events, and the whole body."""

    stream: Callable[[Reply, Mailbox, int, Gone], AsyncIterator[bytes]]
    whole: Callable[[Reply], dict[str, Any]]
    streaming: Callable[[AsyncIterator[bytes]], Response] = sse_response  # (the stream's HTTP response)


OPENAI = Shape(stream, Reply.whole)


class Generations:
    """The handler of chat and completions requests, and the replies their clients left."""

    def __init__(self, pool: ModelPool, config: Config, metrics: Metrics) -> None:
        self.pool, self.config, self.metrics = pool, config, metrics
        self._left: set[asyncio.Task[None]] = set()  # replies whose clients went away (_count_left)

    async def generate(self, http: HttpRequest, *, chat: bool) -> Response:
        body = schema.parse_body(await read_body(http))
        return await self.respond(http, schema.parse_generation(body, chat=chat), OPENAI)

    async def respond(self, http: HttpRequest, gen: schema.Generation, shape: Shape) -> Response:
        """Run a checked request and answer in `shape` (OpenAI's, or another API's at the edge)."""
        served = await self.pool.get(gen.model)
        if served.embeds:
            raise ApiError(400, f"{served.name} is an embedding model: it answers /v1/embeddings, not "
                           "chat or completions", param="model", code="model_not_supported")
        ready = await asyncio.to_thread(prepare, served, gen, self.config)
        thinking = ready.thinking
        mailbox = Mailbox(asyncio.get_running_loop())
        requests = _submit(served, gen, ready.tokens, ready.params, mailbox, checkpoint=ready.checkpoint,
                           thinking=thinking.plan if thinking is not None else None, media=ready.media)
        reply = Reply(served, gen, len(ready.tokens), self.metrics.of(served.name), thinking=thinking,
                      calls=ready.calls)
        gone = functools.partial(self._abandon, reply, mailbox, requests, served)
        if gen.stream:
            return shape.streaming(shape.stream(reply, mailbox, len(requests), gone))
        left = await self._collect(http, reply, mailbox, requests, gone)
        return left or JSONResponse(shape.whole(reply))

    async def _collect(self, http: HttpRequest, reply: Reply, mailbox: Mailbox, requests: list[Request],
                       gone: Gone) -> Response | None:
        """Every choice's end taken into `reply`; a 499 if the client went away first."""
        ended = 0
        left = asyncio.ensure_future(disconnected(http))
        try:
            while ended < len(requests):
                take = asyncio.ensure_future(mailbox.take())
                await asyncio.wait({take, left}, return_when=asyncio.FIRST_COMPLETED)
                if not take.done():
                    take.cancel()
                    gone(len(requests) - ended, [])
                    return Response(status_code=499)
                for choice, item in take.result():
                    if isinstance(item, Delta):
                        reply.add(choice, item)
                    else:
                        ended += 1
                        reply.end(choice, item)
        finally:
            left.cancel()
        if reply.error is not None:  # accepted, then failed: the model failed or the server is stopping
            raise ApiError(503, reply.error, type="server_error", code="generation_failed")
        return None

    def _abandon(self, reply: Reply, mailbox: Mailbox, requests: list[Request], served: Served,
                 remaining: int, taken: list[tuple[int, Delta | Outcome]]) -> None:
        """The client went away: free the slots at the next step, and count what is left."""
        _cancel(served, requests)
        self._count_left(reply, mailbox, remaining, taken)

    def _count_left(self, reply: Reply, mailbox: Mailbox, remaining: int,
                    taken: list[tuple[int, Delta | Outcome]]) -> None:
        """The choices of a reply whose client went away still end (cancelled at the next step):
        take their outcomes (after those already `taken`), so that /metrics counts them
        (finished_reason "abort")."""
        async def drain() -> None:
            left, items = remaining, taken
            while True:
                for choice, item in items:
                    if not isinstance(item, Delta):
                        left -= 1
                        reply.end(choice, item)
                if not left:
                    return
                items = await mailbox.take()

        task = asyncio.ensure_future(drain())
        self._left.add(task)
        task.add_done_callback(self._left.discard)


def _submit(served: Served, gen: schema.Generation, tokens: list[int], params: SamplingParams,
            mailbox: Mailbox, *, checkpoint: int = 0, thinking: ThinkingPlan | None = None,
            media: Any = None) -> list[Request]:
    requests = []
    try:
        for i in range(gen.n):
            choice_params = params
            if params.seed is not None and i:  # the choices differ, and each can be reproduced
                choice_params = replace(params, seed=(params.seed + i) % 0xFFFFFFFF)
            request = Request(i, tokens, choice_params, logprobs=gen.logprobs,
                              on_delta=mailbox.sender(i), checkpoint=checkpoint, thinking=thinking,
                              media=media)
            served.engine.submit(request, on_done=mailbox.sender(i))
            requests.append(request)
    except (Busy, Closed) as e:
        _cancel(served, requests)
        if isinstance(e, Closed):
            raise busy("the server is shutting down", 5) from None
        raise busy(f"the server is busy: {e}") from None
    return requests


def _cancel(served: Served, requests: list[Request]) -> None:
    for r in requests:
        served.engine.cancel(r)
