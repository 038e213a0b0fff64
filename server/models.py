"""The models a server holds in memory: loaded on first use, at most `max_models` at once
(the least recently used idle one is unloaded first), and unloaded after `keep_alive`
seconds without requests.

How a name becomes a loaded model is server/loading.py's (resolving it offline, then the
library's one way to open a model); the pool is given that `open_model` function and keeps
the engines.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from infer.runtime.engine import Engine
from infer.runtime.errors import InferError, ModelNotFoundError
from infer.runtime.llama import Model
from infer.runtime.loading import OpenedModel
from infer.runtime.prompt_cache import PromptCache
from infer.runtime.speculative import SpecParams
from infer.server.errors import ApiError, busy


@dataclass(eq=False)
class Served:
    name: str
    opened: OpenedModel
    engine: Engine
    projector: Any = None  # runtime.llama.Projector: reads the requests' images and audio (None: none)

    @property
    def model(self) -> Model:
        return self.opened.model

    @property
    def embeds(self) -> bool:
        """An embedding model (runtime/embed_engine.py), not a chat model."""
        return hasattr(self.engine, "embedder")


@dataclass
class StopReport:
    """What the server was doing when it was asked to stop, and what the stop ended."""

    why: str  # "SIGTERM", "SIGINT"...
    grace_s: float
    running: int
    waiting: int
    cut_off: int = 0  # running requests ended at the end of the grace period
    refused: int = 0  # waiting requests ended unstarted

    def line(self) -> str:
        stopped = f"stopped ({self.why or 'asked'}) while"
        if not self.running and not self.waiting:
            return f"{stopped} idle"
        return (f"{stopped} {self.running} request{'s' * (self.running != 1)} running, {self.waiting} "
                f"waiting; {self.running - self.cut_off} finished in the {self.grace_s:g} s grace period, "
                f"{self.cut_off} cut off, {self.refused} refused")


def _projector(opened: OpenedModel, engine: Engine) -> Any:
    """The model's projector on the devices and with the flash attention of its context."""
    if opened.projector_file is None:
        return None
    from infer.runtime.llama import Projector

    context = engine.context
    return Projector(opened.projector_file, opened.model, n_threads=context.n_threads,
                     use_gpu=opened.model.local_gpu, flash_attn=context.flash_attn)


class ModelPool:
    def __init__(self, open_model: Callable[[str], OpenedModel], *, default: str | None,
                 listing: Callable[[], list[str]], max_models: int = 1, keep_alive_s: float | None = 300.0,
                 max_waiting: int = 256, speculation: SpecParams | None = None,
                 prompt_cache: PromptCache | None = None,
                 find_model: Callable[[str], object] | None = None) -> None:
        """``find_model(name)``: raises ModelNotFoundError (or another InferError) for a name
        that cannot be served, quickly and without loading it: asked before a loaded model is
        unloaded to make room, so that a request for an unknown model unloads nothing."""
        self.open_model, self.default, self.listing = open_model, default, listing
        self.find_model = find_model
        self.max_models, self.keep_alive_s, self.max_waiting = max_models, keep_alive_s, max_waiting
        self.speculation, self.prompt_cache = speculation, prompt_cache
        self.loaded: dict[str, Served] = {}  # least recently used first
        self.loading: set[str] = set()
        self._locks: dict[str, asyncio.Lock] = {}
        self._closed = False
        self.stop: StopReport | None = None  # what a stop found and ended (begin_close, close)

    def name_for(self, requested: str | None) -> str:
        """The model a request names (the default one when it names none)."""
        if requested is None or requested == "":
            if self.default is None:
                raise ApiError(400, "model is required (this server has no default model)", param="model")
            return self.default
        if requested != self.default and _is_path(requested):
            raise ApiError(404, f"{requested}: a request names models by alias or Hub reference, not by path",
                           param="model", code="model_not_found")
        return requested

    async def get(self, requested: str | None) -> Served:
        name = self.name_for(requested)
        served = self.loaded.get(name)
        if served is None:
            lock = self._locks.setdefault(name, asyncio.Lock())
            async with lock:
                served = self.loaded.get(name) or await self._load(name)
        self.loaded[name] = self.loaded.pop(name)  # the most recently used now
        return served

    async def _load(self, name: str) -> Served:
        if self._closed:
            raise busy("the server is shutting down")
        self.loading.add(name)  # (from the first step: /health says 503 until the model is in)
        try:
            if self.find_model is not None:
                with _as_api_error(name):
                    await asyncio.to_thread(self.find_model, name)
            while len(self.loaded) >= self.max_models:
                idle = [s for s in self.loaded.values() if s.engine.idle]
                if not idle:
                    raise busy(f"the {len(self.loaded)} loaded model(s) are busy; --max-models is "
                               f"{self.max_models}", 5)
                await self.unload(idle[0])
            with _as_api_error(name):
                opened = await asyncio.to_thread(self.open_model, name)
                engine = projector = None
                try:
                    engine = await asyncio.to_thread(self._engine, opened, name)
                    if not hasattr(engine, "embedder"):
                        projector = await asyncio.to_thread(_projector, opened, engine)
                except BaseException:
                    if engine is not None:
                        engine.close()
                    opened.model.close()
                    raise
        finally:
            self.loading.discard(name)
        served = Served(name, opened, engine, projector)
        self.loaded[name] = served
        return served

    def _engine(self, opened: OpenedModel, name: str) -> Any:
        """A chat model's engine (the continuous batch), or an embedding model's (one whose GGUF,
        or else its alias, records its pooling)."""
        from infer.runtime.embedding import pools

        pooling = pools(opened.model) or opened.pooling
        if pooling is not None:
            from dataclasses import replace

            from infer.runtime.embed_engine import EmbedEngine

            return EmbedEngine(opened.model, replace(opened.params, pooling=pooling))
        return Engine(opened.model, opened.params, parallel=opened.parallel, speculation=self.speculation,
                      max_waiting=self.max_waiting, prompt_cache=self.prompt_cache, cache_name=name)

    async def unload(self, served: Served, grace_s: float = 0.0) -> None:
        if self.loaded.get(served.name) is served:
            del self.loaded[served.name]
        await asyncio.to_thread(served.engine.close, grace_s)
        self._record_use(served)
        if served.projector is not None:
            served.projector.close()
        served.model.close()

    @staticmethod
    def _record_use(served: Served) -> None:
        """`infer list`'s LAST USED: when the model last served a request."""
        from infer.quant.store import record_use

        idle_s = time.monotonic() - served.engine.last_used
        record_use(served.model.path, at=time.time() - idle_s)

    async def reap(self, every_s: float = 1.0) -> None:
        """Unload models idle for longer than keep_alive, until cancelled."""
        if self.keep_alive_s is None:
            return
        while True:
            await asyncio.sleep(min(every_s, max(self.keep_alive_s, 0.05)))
            now = time.monotonic()
            for served in list(self.loaded.values()):
                if served.engine.idle and now - served.engine.last_used >= self.keep_alive_s:
                    with contextlib.suppress(Exception):
                        await self.unload(served)

    def names(self) -> list[str]:
        """What can be served: the loaded models, the default, and the models on this machine."""
        names = list(self.loaded)
        for name in ([self.default] if self.default else []) + self.listing():
            if name not in names:
                names.append(name)
        return names

    def begin_close(self, grace_s: float, why: str = "") -> None:
        """Start winding down (from a signal handler): no new models or requests; running
        requests end within `grace_s` seconds."""
        self._closed = True
        if self.stop is None:
            engines = [s.engine for s in self.loaded.values()]
            self.stop = StopReport(why, grace_s, running=sum(e.running for e in engines),
                                   waiting=sum(e.waiting for e in engines))
        for served in self.loaded.values():
            served.engine.shutdown(grace_s)

    async def close(self, grace_s: float) -> None:
        """Unload everything; running requests get up to `grace_s` seconds to finish."""
        self._closed = True
        served = list(self.loaded.values())
        await asyncio.gather(*(self.unload(s, grace_s) for s in served))
        if self.stop is not None:
            self.stop.cut_off = sum(s.engine.cut_off for s in served)
            self.stop.refused = sum(s.engine.refused for s in served)


@contextlib.contextmanager
def _as_api_error(name: str) -> Iterator[None]:
    """infer's errors about the model `name` as the API's: 404 unknown, 400 unusable."""
    try:
        yield
    except ModelNotFoundError as e:
        raise ApiError(404, str(e), param="model", code="model_not_found") from None
    except InferError as e:
        raise ApiError(400, f"{name}: {e}", param="model", code="model_not_available") from None


def _is_path(name: str) -> bool:
    """Whether a requested name points into the file system (only the served MODEL may)."""
    parts = re.split(r"[\\/]", name)
    return (name.startswith(("/", "~", "\\")) or name.lower().endswith(".gguf") or ".." in parts
            or "." in parts or re.match(r"[A-Za-z]:[\\/]", name) is not None)
