"""An embedding model as a server holds it (issue 37): its Embedder shared by every request,
with the counts a model pool reads of an engine (idle, last used, running, waiting) so that
embedding and chat models are loaded, kept and unloaded by the same rules.

Requests that arrive while the context is busy wait together, and the next turn decodes all
their texts as one list: texts of different requests share a `llama_decode` as one request's
texts do (Embedder packs them), so many clients each sending one text are served as one
client sending them all. Each request's vectors are then cut and normalized as it asked.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from infer.runtime.embedding import Embedder, EmbedParams, embedding_context, shaped
from infer.runtime.llama import Context, Model
from infer.runtime.params import ContextParams


@dataclass
class _Job:
    """One request's texts (or a reranker's pairs), and what became of them."""

    texts: Sequence[Sequence[int]]
    done: threading.Event = field(default_factory=threading.Event)
    vectors: list[np.ndarray] = field(default_factory=list)
    error: BaseException | None = None


class EmbedEngine:
    """`embed` and `scores` from any thread; the waiting requests' texts decoded together."""

    def __init__(self, model: Model, params: ContextParams) -> None:
        context = Context(model, embedding_context(params, params.n_batch))
        self.embedder = Embedder(model, context, owns_model=False)
        self.context = context
        self._turn = threading.Lock()  # held by the thread decoding a turn's texts
        self._count = threading.Lock()  # guards the queue and the counts
        self._queue: list[_Job] = []
        self.running = self.waiting = 0
        self.turns = 0  # decoding turns taken (each serves every request waiting when it began)
        self.last_used = time.monotonic()
        self.cut_off = self.refused = self.preemptions = 0
        self.kv_usage = 0.0

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    def embed(self, texts: Sequence[Sequence[int]], params: EmbedParams) -> list[np.ndarray]:
        """The texts' vectors (tokens from `self.embedder.tokens`), in order."""
        self.embedder.check(params)
        return [shaped(v, params) for v in self._served(_Job(texts))]

    def scores(self, pairs: Sequence[Sequence[int]]) -> list[float]:
        """A reranker's scores of query-document pairs (`self.embedder.pair_tokens`), in order."""
        return [float(v[0]) for v in self._served(_Job(pairs))]

    def _served(self, job: _Job) -> list[np.ndarray]:
        """`job`'s raw vectors: decoded in the first turn that begins after it is queued (by
        this thread, or by one whose turn took it along)."""
        with self._count:
            self._queue.append(job)
            self.waiting += 1
        with self._turn:
            if not job.done.is_set():
                self._take_turn()
        if job.error is not None:
            raise job.error
        return job.vectors

    def _take_turn(self) -> None:
        """Decode the texts of every queued job as one list, and hand each its vectors."""
        with self._count:
            jobs, self._queue = self._queue, []
            self.waiting -= len(jobs)
            self.running += len(jobs)
            self.turns += 1
        try:
            vectors = self.embedder.raw_vectors([t for job in jobs for t in job.texts])
            for job in jobs:
                job.vectors = [next(vectors) for _ in job.texts]
        except BaseException as e:  # (each job waiting for it hears of it)
            for job in jobs:
                job.error = job.error or e
            raise
        finally:
            for job in jobs:
                job.done.set()
            with self._count:
                self.running -= len(jobs)
            self.last_used = time.monotonic()

    def shutdown(self, grace_s: float = 0.0) -> None:
        """(A request's texts are one decode after another: nothing to cut short.)"""

    def close(self, grace_s: float = 0.0) -> None:
        """Free the context (the model is the pool's to close), after the turn running."""
        with self._turn:
            self.embedder.close()
