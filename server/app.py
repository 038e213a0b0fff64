"""The HTTP API: OpenAI's chat and completions endpoints over the engines' continuous batch.

Each request is checked in `schema`, its prompt rendered and tokenized off the event
loop, and its choices submitted to the model's engine. What the engine's thread
produces reaches the request's handler through a `Mailbox`: the engine never waits
for a reader, and a slow reader only lets text pile up (at most its token limit).
A client that goes away has its choices cancelled: their slots are free at the next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from infer.runtime.engine import Busy, Closed
from infer.runtime.errors import InferError
from infer.runtime.request_params import logit_bias_error
from infer.runtime.sampling import SamplingParams
from infer.runtime.scheduler import Delta, Outcome, Request, TokenLogprob
from infer.server import schema
from infer.server.errors import ApiError, busy, invalid
from infer.server.metrics import Metrics, ModelMetrics
from infer.server.models import ModelPool, Served

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "length"}


class Mailbox:
    """What the engine's thread hands one HTTP request: (choice, Delta or Outcome) items."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: list[tuple[int, Delta | Outcome]] = []
        self._lock = threading.Lock()
        self._woken = asyncio.Event()
        self._scheduled = False

    def put(self, choice: int, item: Delta | Outcome) -> None:  # on the engine's thread
        with self._lock:
            self._items.append((choice, item))
            if self._scheduled:
                return
            self._scheduled = True
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is reading any more
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        with self._lock:
            self._scheduled = False
        self._woken.set()

    async def take(self) -> list[tuple[int, Delta | Outcome]]:
        while True:
            with self._lock:
                items, self._items = self._items, []
            if items:
                return items
            self._woken.clear()
            await self._woken.wait()


@dataclass
class Config:
    api_key: str | None = None
    sampling: tuple[tuple[str, Any], ...] = ()  # the server's defaults (its command's flags)
    chat_template: str | None = None
    shutdown_grace_s: float = 5.0


class Api:
    def __init__(self, pool: ModelPool, config: Config) -> None:
        self.pool, self.config = pool, config
        self.metrics = Metrics()
        self.started = int(time.time())
        self._left: set[asyncio.Task[None]] = set()  # replies whose clients went away (_count_left)

    # -- endpoints -----------------------------------------------------------------------------

    async def health(self, request: HttpRequest) -> Response:
        if self.pool.loading:
            return JSONResponse({"status": "loading", "loading": sorted(self.pool.loading)}, status_code=503)
        return JSONResponse({"status": "ok", "loaded": list(self.pool.loaded)})

    async def models(self, request: HttpRequest) -> Response:
        names = await asyncio.to_thread(self.pool.names)
        data = [{"id": name, "object": "model", "created": self.started, "owned_by": "infer"}
                for name in names]
        return JSONResponse({"object": "list", "data": data})

    async def metrics_text(self, request: HttpRequest) -> Response:
        gauges = {name: (s.engine.running, s.engine.waiting, s.engine.kv_usage)
                  for name, s in self.pool.loaded.items()}
        return PlainTextResponse(self.metrics.render(gauges), media_type="text/plain; version=0.0.4")

    async def chat(self, request: HttpRequest) -> Response:
        return await self._generate(request, chat=True)

    async def completions(self, request: HttpRequest) -> Response:
        return await self._generate(request, chat=False)

    # -- a generation ----------------------------------------------------------------------------

    async def _generate(self, http: HttpRequest, *, chat: bool) -> Response:
        body = schema.parse_body(await _read_body(http))
        gen = schema.parse_generation(body, chat=chat)
        served = await self.pool.get(gen.model)
        tokens, params, checkpoint = await asyncio.to_thread(self._prepare, served, gen)
        mailbox = Mailbox(asyncio.get_running_loop())
        requests = self._submit(served, gen, tokens, params, mailbox, checkpoint=checkpoint)
        reply = _Reply(served, gen, len(tokens), self.metrics.of(served.name))
        if gen.stream:
            return StreamingResponse(self._stream(reply, mailbox, requests, served),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await self._collect(http, reply, mailbox, requests, served)

    def _prepare(self, served: Served, gen: schema.Generation) -> tuple[list[int], SamplingParams, int]:
        """The prompt's tokens, the sampling parameters and the prompt cache's checkpoint (off
        the event loop: templates and tokenizing a long prompt take time)."""
        from infer.runtime.prompt import chat_prompt

        model = served.model
        try:
            params = SamplingParams.resolve(served.opened.sampling_defaults,
                                            {**dict(self.config.sampling), **gen.overrides})
            if gen.chat:
                tokens = chat_prompt(model, list(gen.messages), template=self.config.chat_template).tokens
            elif isinstance(gen.prompt, str):
                tokens = model.tokenize(gen.prompt, add_special=True, parse_special=False)
            else:
                bad = [t for t in gen.prompt if t >= model.n_vocab]
                if bad:
                    raise invalid("prompt", f"token id {bad[0]} is not in the model's vocabulary "
                                  f"of {model.n_vocab}")
                tokens = list(gen.prompt)
        except InferError as e:
            raise invalid(None, str(e)) from None
        if params.effective_grammar is not None:  # a bad grammar is the client's mistake: 400 now
            from infer.runtime.sampling import build_sampler_chain

            try:
                build_sampler_chain(params, model).close()
            except InferError as e:
                raise invalid("grammar" if params.grammar else "response_format", str(e)) from None
        for token, _ in params.logit_bias:  # (the runtime's rule, before a stream starts)
            problem = logit_bias_error(token, model.n_vocab)
            if problem is not None:
                raise invalid("logit_bias", problem)
        if not tokens:
            raise invalid("prompt" if not gen.chat else "messages", "the prompt is empty")
        problem = served.engine.fit_error(len(tokens), params.max_tokens)
        if problem is not None:
            limit = served.engine.slot_cells
            raise invalid("messages" if gen.chat else "prompt",
                          f"this request needs {len(tokens) + (params.max_tokens or 1)} tokens of context "
                          f"({len(tokens)} in the prompt, {params.max_tokens or 1} to generate) but a "
                          "request "
                          f"may use {limit} (the context of {served.engine.context.n_ctx} tokens shared by "
                          f"{served.engine.parallel} parallel slots)", code="context_length_exceeded")
        return tokens, params, self._checkpoint(served, gen, tokens)

    def _checkpoint(self, served: Served, gen: schema.Generation, tokens: list[int]) -> int:
        """Where the prompt cache may save the prompt's state: before the last message of a
        chat (what the next turn of the conversation sends again), the whole of a raw prompt."""
        cache = served.engine.prompt_cache
        if cache is None or len(tokens) <= cache.min_tokens:
            return 0
        if not gen.chat:
            return len(tokens)
        from infer.runtime.prompt import preamble_len

        return preamble_len(served.model, list(gen.messages), tokens, template=self.config.chat_template)

    def _submit(self, served: Served, gen: schema.Generation, tokens: list[int], params: SamplingParams,
                mailbox: Mailbox, *, checkpoint: int = 0) -> list[Request]:
        requests = []
        try:
            for i in range(gen.n):
                choice_params = params
                if params.seed is not None and i:  # the choices differ, and each can be reproduced
                    choice_params = replace(params, seed=(params.seed + i) % 0xFFFFFFFF)
                request = Request(i, tokens, choice_params, logprobs=gen.logprobs,
                                  on_delta=_put(mailbox, i), checkpoint=checkpoint)
                served.engine.submit(request, on_done=_put(mailbox, i))
                requests.append(request)
        except Busy as e:
            for r in requests:
                served.engine.cancel(r)
            raise busy(f"the server is busy: {e}") from None
        except Closed:
            for r in requests:
                served.engine.cancel(r)
            raise busy("the server is shutting down", 5) from None
        return requests

    async def _stream(self, reply: _Reply, mailbox: Mailbox, requests: list[Request],
                      served: Served) -> AsyncIterator[bytes]:
        ended = 0
        taken: list[tuple[int, Delta | Outcome]] = []  # from the mailbox, not sent yet
        try:
            for i in range(len(requests)):
                if reply.gen.chat:
                    yield _sse(reply.chunk(i, {"role": "assistant", "content": ""}))
            while ended < len(requests):
                taken = taken or await mailbox.take()
                choice, item = taken.pop(0)
                if isinstance(item, Delta):
                    yield _sse(reply.delta_chunk(choice, item))
                else:
                    ended += 1
                    yield _sse(reply.end_chunk(choice, item))
            if reply.gen.include_usage:
                yield _sse(reply.usage_chunk())
            yield b"data: [DONE]\n\n"
        finally:
            if ended < len(requests):  # the client went away: free the slots at the next step
                for r in requests:
                    served.engine.cancel(r)
                self._count_left(reply, mailbox, len(requests) - ended, taken)

    async def _collect(self, http: HttpRequest, reply: _Reply, mailbox: Mailbox, requests: list[Request],
                       served: Served) -> Response:
        ended = 0
        gone = asyncio.ensure_future(_disconnected(http))
        try:
            while ended < len(requests):
                take = asyncio.ensure_future(mailbox.take())
                await asyncio.wait({take, gone}, return_when=asyncio.FIRST_COMPLETED)
                if not take.done():
                    take.cancel()
                    for r in requests:
                        served.engine.cancel(r)
                    self._count_left(reply, mailbox, len(requests) - ended, [])
                    return Response(status_code=499)
                for choice, item in take.result():
                    if isinstance(item, Delta):
                        reply.add(choice, item)
                    else:
                        ended += 1
                        reply.end(choice, item)
        finally:
            gone.cancel()
        if reply.error is not None:  # accepted, then failed: the model failed or the server is stopping
            raise ApiError(503, reply.error, type="server_error", code="generation_failed")
        return JSONResponse(reply.whole())


    def _count_left(self, reply: _Reply, mailbox: Mailbox, remaining: int,
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


class _Reply:
    """The choices of one response as they grow, in OpenAI's shapes."""

    def __init__(self, served: Served, gen: schema.Generation, prompt_tokens: int,
                 metrics: ModelMetrics) -> None:
        self.served, self.gen, self.metrics = served, gen, metrics
        self.model = served.name
        self.id = ("chatcmpl-" if gen.chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.prompt_tokens = prompt_tokens
        self.texts = [""] * gen.n
        self.logprobs: list[list[TokenLogprob]] = [[] for _ in range(gen.n)]
        self.finish: list[str | None] = [None] * gen.n
        self.tokens: list[list[int]] = [[] for _ in range(gen.n)]
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.error: str | None = None
        self.first: Any = None  # the first choice's Completion (for the `infer` extension)

    def add(self, choice: int, delta: Delta) -> None:
        self.texts[choice] += delta.text
        self.logprobs[choice] += delta.logprobs

    def end(self, choice: int, outcome: Outcome) -> None:
        completion = outcome.completion
        if completion is None:  # failed after it was accepted (the model failed, or shutdown)
            self.metrics.errors += 1
            self.error = outcome.error
            self.finish[choice] = "length"
            return
        self.finish[choice] = FINISH.get(completion.finish_reason, "stop")
        self.tokens[choice] = completion.tokens
        self.completion_tokens += completion.usage.completion_tokens
        if choice == 0:
            self.cached_tokens = completion.usage.cached_tokens
            self.first = completion
        reason = "abort" if completion.finish_reason == "cancelled" else self.finish[choice]
        self.metrics.ended(completion.usage, completion.timings, reason)

    def usage(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}

    def extension(self) -> dict[str, Any]:
        """infer's own figures of the first choice, as `infer run --json` reports them (what
        `infer run` prints through a server): why it ended, the seed, speculation, timings."""
        c = self.first
        if c is None:
            return {}
        t = c.timings
        return {"infer": {"finish_reason": c.finish_reason, "seed": c.seed,
                          "draft_tokens": c.usage.draft_tokens, "accepted_tokens": c.usage.accepted_tokens,
                          "timings": {"prefill_ms": t.prefill_ms, "decode_ms": t.decode_ms,
                                      "ttft_ms": t.ttft_ms, "prefill_tokens": t.prefill_tokens}}}

    def _logprobs(self, entries: list[TokenLogprob]) -> dict[str, Any] | None:
        if self.gen.logprobs is None:
            return None
        model = self.served.model

        def piece(token: int) -> tuple[str, list[int]]:
            data = model.token_bytes(token)
            return data.decode("utf-8", errors="replace"), list(data)

        if self.gen.chat:
            content = []
            for e in entries:
                text, data = piece(e.token)
                top = []
                for t, lp in e.top:
                    top_text, top_data = piece(t)
                    top.append({"token": top_text, "logprob": lp, "bytes": top_data})
                content.append({"token": text, "logprob": e.logprob, "bytes": data, "top_logprobs": top})
            return {"content": content}
        return {"tokens": [piece(e.token)[0] for e in entries],
                "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": [{piece(t)[0]: lp for t, lp in e.top} for e in entries],
                "text_offset": _offsets([piece(e.token)[0] for e in entries])}

    def whole(self) -> dict[str, Any]:
        if self.gen.chat:
            choices = [{"index": i, "message": {"role": "assistant", "content": self.texts[i]},
                        "logprobs": self._logprobs(self.logprobs[i]), "finish_reason": self.finish[i]}
                       for i in range(self.gen.n)]
            kind = "chat.completion"
        else:
            choices = [{"index": i, "text": self.texts[i], "logprobs": self._logprobs(self.logprobs[i]),
                        "finish_reason": self.finish[i]} for i in range(self.gen.n)]
            kind = "text_completion"
        if self.gen.return_tokens:  # llama-server's extension: the generated token ids
            for i, choice in enumerate(choices):
                choice["tokens"] = self.tokens[i]
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "choices": choices, "usage": self.usage(), "system_fingerprint": None, **self.extension()}

    def chunk(self, choice: int, delta: dict[str, Any], finish: str | None = None,
              logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        if self.gen.chat:
            body = {"index": choice, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            kind = "chat.completion.chunk"
        else:
            body = {"index": choice, "text": delta.get("content", ""), "logprobs": logprobs,
                    "finish_reason": finish}
            kind = "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "choices": [body], "system_fingerprint": None}

    def delta_chunk(self, choice: int, delta: Delta) -> dict[str, Any]:
        return self.chunk(choice, {"content": delta.text}, logprobs=self._logprobs(delta.logprobs))

    def end_chunk(self, choice: int, outcome: Outcome) -> dict[str, Any]:
        self.end(choice, outcome)
        return self.chunk(choice, {}, finish=self.finish[choice])

    def usage_chunk(self) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.gen.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "choices": [], "usage": self.usage(), "system_fingerprint": None, **self.extension()}


def _offsets(pieces: list[str]) -> list[int]:
    out, at = [], 0
    for p in pieces:
        out.append(at)
        at += len(p)
    return out


def _put(mailbox: Mailbox, choice: int) -> Callable[[Any], None]:
    return lambda item: mailbox.put(choice, item)


def _sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


async def _read_body(http: HttpRequest) -> bytes:
    declared = http.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > schema.MAX_BODY_BYTES:
        raise ApiError(413, f"the request body is larger than {schema.MAX_BODY_BYTES} bytes",
                       code="body_too_large")
    chunks, size = [], 0
    async for chunk in http.stream():
        size += len(chunk)
        if size > schema.MAX_BODY_BYTES:
            raise ApiError(413, f"the request body is larger than {schema.MAX_BODY_BYTES} bytes",
                           code="body_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


async def _disconnected(http: HttpRequest) -> None:
    """Returns when the client has gone away."""
    while True:
        message = await http.receive()
        if message["type"] == "http.disconnect":
            return


def create_app(pool: ModelPool, config: Config, lifespan: Any = None) -> Starlette:
    api = Api(pool, config)

    async def api_error(request: HttpRequest, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    async def not_found(request: HttpRequest, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        return JSONResponse(ApiError(status, f"{request.method} {request.url.path}: "
                                     f"{'no such endpoint' if status == 404 else 'not allowed'}",
                                     code="not_found" if status == 404 else "method_not_allowed").body(),
                            status_code=status)

    routes = [
        Route("/health", api.health, methods=["GET"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/metrics", api.metrics_text, methods=["GET"]),
        Route("/v1/chat/completions", api.chat, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
    ]
    app = Starlette(routes=routes, exception_handlers={ApiError: api_error, 404: not_found, 405: not_found},
                    lifespan=lifespan)
    app.state.api = api
    if config.api_key is not None:
        return _with_api_key(app, config.api_key)  # type: ignore[return-value]
    return app


def _with_api_key(app: Starlette, key: str) -> Any:
    """Every path but /health needs `Authorization: Bearer KEY` (compared in constant time)."""
    expected = f"Bearer {key}".encode()

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] != "/health":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, expected):
                error = ApiError(401, "a valid API key is required (Authorization: Bearer KEY)",
                                 code="invalid_api_key")
                response = JSONResponse(error.body(), status_code=401,
                                        headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await app(scope, receive, send)

    guarded.state = app.state  # type: ignore[attr-defined]
    return guarded
