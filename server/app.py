"""The HTTP API: OpenAI's chat, completions and Responses endpoints, Anthropic's Messages and
Ollama's native API over the engines' continuous batch, with /health, /v1/models and
/metrics; the ASGI app, its routes and its error bodies.

How a generation runs is in `generation`; `Config` (importable from here) in `config`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from infer.server import (
    anthropic,
    anthropic_reply,
    embeddings,
    infill_reply,
    ollama,
    ollama_models,
    ollama_reply,
    rerank,
    responses,
    responses_reply,
    schema,
)
from infer.server.auth import with_api_key
from infer.server.config import Config
from infer.server.errors import ApiError
from infer.server.generation import Generations, Shape
from infer.server.incoming import read_body
from infer.server.metrics import Metrics
from infer.server.models import ModelPool
from infer.server.prepare import prompt_tokens
from infer.server.response_store import ResponseStore

ANTHROPIC = Shape(anthropic_reply.stream, anthropic_reply.whole)
INFILL = Shape(infill_reply.stream, infill_reply.whole)

__all__ = ["Api", "Config", "create_app"]


class Api:
    def __init__(self, pool: ModelPool, config: Config) -> None:
        self.pool, self.config = pool, config
        self.metrics = Metrics()
        self.started = int(time.time())
        self.generations = Generations(pool, config, self.metrics)
        self.stored = ResponseStore()  # OpenAI's Responses API: the responses kept

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
        gauges = {name: (s.engine.running, s.engine.waiting, s.engine.kv_usage, s.engine.preemptions)
                  for name, s in self.pool.loaded.items()}
        return PlainTextResponse(self.metrics.render(gauges), media_type="text/plain; version=0.0.4")

    async def chat(self, request: HttpRequest) -> Response:
        return await self.generations.generate(request, chat=True)

    async def completions(self, request: HttpRequest) -> Response:
        return await self.generations.generate(request, chat=False)

    async def messages(self, request: HttpRequest) -> Response:
        """Anthropic's Messages API: translated at the edge (server/anthropic.py)."""
        body = schema.parse_body(await read_body(request))
        gen = schema.parse_generation(anthropic.chat_body(body), chat=True)
        gen = dataclasses.replace(gen, max_tokens_caps=True)
        return await self.generations.respond(request, gen, ANTHROPIC)

    async def count_tokens(self, request: HttpRequest) -> Response:
        body = schema.parse_body(await read_body(request))
        gen = schema.parse_generation(anthropic.chat_body(body, count_only=True), chat=True)
        served = await self.pool.get(gen.model)
        count = await asyncio.to_thread(prompt_tokens, served, gen, self.config)
        return JSONResponse({"input_tokens": count})

    async def responses(self, request: HttpRequest) -> Response:
        """OpenAI's Responses API: translated at the edge (server/responses.py), the response
        kept in `stored` unless the request says `store: false`."""
        body = schema.parse_body(await read_body(request))
        asked = responses.request(body, self.stored)
        gen = schema.parse_generation(asked.chat, chat=True)
        return await self.generations.respond(request, gen, responses_reply.shape(asked, self.stored))

    async def stored_response(self, request: HttpRequest) -> Response:
        response_id = request.path_params["response_id"]
        found = self.stored.get(response_id)
        if found is None:
            raise responses.not_found(response_id)
        return JSONResponse(found.response)

    async def delete_response(self, request: HttpRequest) -> Response:
        response_id = request.path_params["response_id"]
        if not self.stored.delete(response_id):
            raise responses.not_found(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    async def embeddings(self, request: HttpRequest) -> Response:
        """OpenAI's /v1/embeddings (server/embeddings.py)."""
        body = schema.parse_body(await read_body(request))
        served = await self.pool.get(body.get("model"))
        engine = embeddings.engine_of(served)
        asked = await asyncio.to_thread(embeddings.parse, body, engine, served.name)
        vectors = await asyncio.to_thread(engine.embed, asked.tokens, asked.params)
        return JSONResponse(embeddings.reply(served.name, asked, vectors))

    async def ollama_embed(self, request: HttpRequest) -> Response:
        """Ollama's /api/embed and its older /api/embeddings (server/embeddings.py)."""
        legacy = request.url.path == "/api/embeddings"
        body = schema.parse_body(await read_body(request))
        served = await self.pool.get(body.get("model"))
        engine = embeddings.engine_of(served)
        asked = await asyncio.to_thread(embeddings.parse_ollama, body, engine, served.name, legacy=legacy)
        vectors = await asyncio.to_thread(engine.embed, asked.tokens, asked.params)
        return JSONResponse(embeddings.ollama_reply(served.name, asked, vectors, legacy=legacy))

    async def rerank(self, request: HttpRequest) -> Response:
        """llama-server's, Jina's and Cohere's /v1/rerank (server/rerank.py)."""
        body = schema.parse_body(await read_body(request))
        served = await self.pool.get(body.get("model"))
        asked = await asyncio.to_thread(rerank.parse, body, served)
        scores = await asyncio.to_thread(served.engine.scores, asked.pairs)
        return JSONResponse(rerank.reply(served.name, asked, scores))

    async def infill(self, request: HttpRequest) -> Response:
        """llama-server's /infill (fill in the middle; `/v1/completions` takes a `suffix` too)."""
        gen = schema.parse_infill(schema.parse_body(await read_body(request)))
        return await self.generations.respond(request, gen, INFILL)

    async def ollama_chat(self, request: HttpRequest) -> Response:
        """Ollama's /api/chat and /api/generate: translated at the edge (server/ollama.py)."""
        body = schema.parse_body(await read_body(request))
        return await self._ollama(request, "chat", True, ollama.chat_body(body))

    async def ollama_generate(self, request: HttpRequest) -> Response:
        body = schema.parse_body(await read_body(request))
        return await self._ollama(request, "generate", *ollama.generate_body(body))

    async def _ollama(self, request: HttpRequest, endpoint: str, chat: bool,
                      asked: dict[str, Any]) -> Response:
        """/api/`endpoint`'s request, a chat (the template renders it) or a raw prompt."""
        gen = schema.parse_generation(asked, chat=chat)
        shape = ollama_reply.Shape(chat=endpoint == "chat")
        return await self.generations.respond(request, gen, Shape(shape.stream, shape.whole,
                                                                  ollama_reply.ndjson_response))

    async def ollama_tags(self, request: HttpRequest) -> Response:
        return JSONResponse(ollama_models.tags(self.pool, await asyncio.to_thread(self.pool.names)))

    async def ollama_ps(self, request: HttpRequest) -> Response:
        return JSONResponse(ollama_models.ps(self.pool))

    async def ollama_version(self, request: HttpRequest) -> Response:
        return JSONResponse(ollama_models.version())

    async def ollama_show(self, request: HttpRequest) -> Response:
        body = schema.parse_body(await read_body(request))
        name = body.get("model", body.get("name"))
        if not isinstance(name, str) or not name:
            raise ApiError(400, "model is required", param="model")
        served = await self.pool.get(name)
        return JSONResponse(await asyncio.to_thread(ollama_models.show, served, self.config.chat_template))


def create_app(pool: ModelPool, config: Config, lifespan: Any = None) -> Starlette:
    api = Api(pool, config)
    routes = [
        Route("/health", api.health, methods=["GET"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/metrics", api.metrics_text, methods=["GET"]),
        Route("/v1/chat/completions", api.chat, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/messages", api.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", api.count_tokens, methods=["POST"]),
        Route("/infill", api.infill, methods=["POST"]),
        Route("/v1/embeddings", api.embeddings, methods=["POST"]),
        Route("/embeddings", api.embeddings, methods=["POST"]),
        Route("/v1/rerank", api.rerank, methods=["POST"]),
        Route("/rerank", api.rerank, methods=["POST"]),
        Route("/api/chat", api.ollama_chat, methods=["POST"]),
        Route("/api/generate", api.ollama_generate, methods=["POST"]),
        Route("/api/embed", api.ollama_embed, methods=["POST"]),
        Route("/api/embeddings", api.ollama_embed, methods=["POST"]),
        Route("/api/tags", api.ollama_tags, methods=["GET"]),
        Route("/api/ps", api.ollama_ps, methods=["GET"]),
        Route("/api/show", api.ollama_show, methods=["POST"]),
        Route("/api/version", api.ollama_version, methods=["GET"]),
        Route("/v1/responses", api.responses, methods=["POST"]),
        Route("/v1/responses/{response_id}", api.stored_response, methods=["GET"]),
        Route("/v1/responses/{response_id}", api.delete_response, methods=["DELETE"]),
    ]
    handlers = {ApiError: _api_error, 404: _not_found, 405: _not_found}
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan)
    app.state.api = api
    if config.api_key is not None:
        return with_api_key(app, config.api_key, error_body)  # type: ignore[return-value]
    return app


async def _api_error(request: HttpRequest, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return JSONResponse(error_body(request.url.path, exc), status_code=exc.status, headers=exc.headers)


def error_body(path: str, error: ApiError) -> dict[str, Any]:
    """An error in the shape of the API the path belongs to."""
    if path.startswith("/api/"):
        return ollama.error_body(error)
    return anthropic.error_body(error) if path.startswith("/v1/messages") else error.body()


async def _not_found(request: HttpRequest, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 404)
    error = ApiError(status, f"{request.method} {request.url.path}: "
                     f"{'no such endpoint' if status == 404 else 'not allowed'}",
                     code="not_found" if status == 404 else "method_not_allowed")
    return JSONResponse(error_body(request.url.path, error), status_code=status)
