"""The HTTP API: OpenAI's chat and completions endpoints over the engines' continuous batch,
with /health, /v1/models and /metrics; the ASGI app, its routes and its error bodies.

How a generation runs is in `generation`; `Config` (importable from here) in `config`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from infer.server.auth import with_api_key
from infer.server.config import Config
from infer.server.errors import ApiError
from infer.server.generation import Generations
from infer.server.metrics import Metrics
from infer.server.models import ModelPool

__all__ = ["Api", "Config", "create_app"]


class Api:
    def __init__(self, pool: ModelPool, config: Config) -> None:
        self.pool, self.config = pool, config
        self.metrics = Metrics()
        self.started = int(time.time())
        self.generations = Generations(pool, config, self.metrics)

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


def create_app(pool: ModelPool, config: Config, lifespan: Any = None) -> Starlette:
    api = Api(pool, config)
    routes = [
        Route("/health", api.health, methods=["GET"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/metrics", api.metrics_text, methods=["GET"]),
        Route("/v1/chat/completions", api.chat, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
    ]
    handlers = {ApiError: _api_error, 404: _not_found, 405: _not_found}
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan)
    app.state.api = api
    if config.api_key is not None:
        return with_api_key(app, config.api_key)  # type: ignore[return-value]
    return app


async def _api_error(request: HttpRequest, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _not_found(request: HttpRequest, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 404)
    return JSONResponse(ApiError(status, f"{request.method} {request.url.path}: "
                                 f"{'no such endpoint' if status == 404 else 'not allowed'}",
                                 code="not_found" if status == 404 else "method_not_allowed").body(),
                        status_code=status)
