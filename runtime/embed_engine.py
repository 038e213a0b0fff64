"""An embedding model as a server holds it (issue 37): its Embedder, used by one request at a
time (each request's texts batched together), with the counts a model pool reads of an
engine (idle, last used, running, waiting) so that embedding and chat models are loaded,
kept and unloaded by the same rules.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np

from infer.runtime.embedding import Embedder, EmbedParams, embedding_context
from infer.runtime.llama import Context, Model
from infer.runtime.params import ContextParams


class EmbedEngine:
    """`embed` from any thread; one at a time on the model's embedding context."""

    def __init__(self, model: Model, params: ContextParams) -> None:
        context = Context(model, embedding_context(params, params.n_batch))
        self.embedder = Embedder(model, context, owns_model=False)
        self.context = context
        self._lock = threading.Lock()
        self._count = threading.Lock()
        self.running = self.waiting = 0
        self.last_used = time.monotonic()
        self.cut_off = self.refused = self.preemptions = 0
        self.kv_usage = 0.0

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    def embed(self, texts: Sequence[Sequence[int]], params: EmbedParams) -> list[np.ndarray]:
        """The texts' vectors (tokens from `self.embedder.tokens`), in order."""
        with self._turn():
            return list(self.embedder.vectors(texts, params))

    def scores(self, pairs: Sequence[Sequence[int]]) -> list[float]:
        """A reranker's scores of query-document pairs (`self.embedder.pair_tokens`), in order."""
        with self._turn():
            return self.embedder.scores(pairs)

    @contextmanager
    def _turn(self) -> Iterator[None]:
        """This request's turn on the context, counted as waiting, then running."""
        with self._count:
            self.waiting += 1
        with self._lock:
            with self._count:
                self.waiting -= 1
                self.running += 1
            try:
                yield
            finally:
                with self._count:
                    self.running -= 1
                self.last_used = time.monotonic()

    def shutdown(self, grace_s: float = 0.0) -> None:
        """(A request's texts are one decode after another: nothing to cut short.)"""

    def close(self, grace_s: float = 0.0) -> None:
        """Free the context (the model is the pool's to close), after the request running."""
        with self._lock:
            self.embedder.close()
