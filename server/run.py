"""Running the server: uvicorn on a socket the caller bound, and a clean stop.

Ctrl-C or SIGTERM: the server stops accepting connections; waiting requests end,
running ones get `config.shutdown_grace_s` seconds to finish and are then ended
(finish reason "length"), so every stream ends with its last chunk and ``[DONE]``;
then the models are unloaded and `serve_forever` returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

from infer.runtime.log import logger
from infer.runtime.params import ContextParams
from infer.runtime.prompt_cache import PromptCache
from infer.runtime.speculative import SpecParams
from infer.server.app import Config, create_app
from infer.server.models import ModelPool, StopReport

log = logger("infer.server")


def serve_forever(sockets: list[socket.socket], *, context: ContextParams, parallel: int | None,
                  default: str | None, config: Config, max_models: int = 1,
                  keep_alive_s: float | None = 300.0, max_waiting: int = 256,
                  speculation: SpecParams | None = None, prompt_cache: PromptCache | None = None,
                  verbose: bool = False, mmproj: Path | None = None) -> StopReport | None:
    """Serve until a stop is asked for; what the server was doing then and what it ended.

    The models are those on this machine (server/loading.py), each loaded with `context`
    for all its `parallel` slots (None: from the model's size); `mmproj` is the `default`
    model's projector (others have their repository's, if any)."""
    import uvicorn

    from infer.server.loading import find_model, model_names, open_for_serving

    def open_model(name: str) -> Any:
        return open_for_serving(name, context, parallel, mmproj if name == default else None)

    pool = ModelPool(open_model, default=default, listing=model_names, max_models=max_models,
                     keep_alive_s=keep_alive_s, max_waiting=max_waiting, speculation=speculation,
                     prompt_cache=prompt_cache, find_model=find_model)
    app = create_app(pool, config, lifespan=_lifespan(pool, config))
    server = _Server(uvicorn.Config(app, log_level="info" if verbose else "warning", access_log=verbose,
                                    timeout_graceful_shutdown=int(config.shutdown_grace_s) + 5,
                                    timeout_keep_alive=30, lifespan="on"),
                     on_exit=lambda why: pool.begin_close(config.shutdown_grace_s, why))
    server.run(sockets=sockets)
    return pool.stop


class _Server:
    """uvicorn's server, telling the engines to wind down as soon as a stop is asked for."""

    def __new__(cls, config: Any, on_exit: Callable[[str], None]) -> Any:
        import uvicorn

        class Server(uvicorn.Server):
            def handle_exit(self, sig: int, frame: Any) -> None:
                try:
                    why = signal.Signals(sig).name
                except ValueError:
                    why = f"signal {sig}"
                on_exit(why)
                super().handle_exit(sig, frame)

            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                # As uvicorn's, without raising the signal again afterwards: a stop that was
                # asked for is a clean exit (0), not a death by SIGTERM or a KeyboardInterrupt.
                if threading.current_thread() is not threading.main_thread():
                    yield
                    return
                kept = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
                try:
                    yield
                finally:
                    for sig, handler in kept.items():
                        signal.signal(sig, handler)

        return Server(config)


def _lifespan(pool: ModelPool,
              config: Config) -> Callable[[Any], contextlib.AbstractAsyncContextManager[None]]:
    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(pool.reap())]
        if pool.default is not None:  # load it now; /health says 503 until it is ready
            tasks.append(asyncio.create_task(_preload(pool)))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await pool.close(config.shutdown_grace_s)

    return lifespan


async def _preload(pool: ModelPool) -> None:
    try:
        await pool.get(None)
    except Exception as e:  # the requests that need it will say why
        log.error("could not load %s: %s", pool.default, getattr(e, "message", e))
