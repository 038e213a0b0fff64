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
    done: bool = False  # (read and written under the engine's condition)
    vectors: list[np.ndarray] = field(default_factory=list)
    error: BaseException | None = None


class EmbedEngine:
    """`embed` and `scores` from any thread; the waiting requests' texts decoded together."""

    def __init__(self, model: Model, params: ContextParams) -> None:
        context = Context(model, embedding_context(params, params.n_batch))
        self.embedder = Embedder(model, context, owns_model=False)
        self.context = context
        self._state = threading.Condition()  # guards what follows; told when a turn ends
        self._queue: list[_Job] = []
        self._busy = False  # a thread is decoding a turn's texts
        self._closed = False
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
        """`job`'s raw vectors: decoded in the first turn that begins after it is queued, taken
        by this thread if none is running, else by the thread that starts the next one. A
        finished job's thread returns as soon as its turn ends."""
        with self._state:
            self._queue.append(job)
            self.waiting += 1
            while self._busy and not job.done:
                self._state.wait()
            jobs = None if job.done else self._begin_turn()
        if jobs is not None:
            self._decode(jobs)
        if job.error is not None:
            raise job.error
        return job.vectors

    def _begin_turn(self) -> list[_Job]:
        """(Under the condition) every queued job, now this thread's to decode."""
        if self._closed:
            raise RuntimeError("the embedding model was unloaded")
        jobs, self._queue = self._queue, []
        self._busy = True
        self.waiting -= len(jobs)
        self.running += len(jobs)
        self.turns += 1
        return jobs

    def _decode(self, jobs: list[_Job]) -> None:
        """Decode the texts of `jobs` as one list, hand each its vectors, and end the turn."""
        try:
            vectors = self.embedder.raw_vectors([t for job in jobs for t in job.texts])
            for job in jobs:
                job.vectors = [next(vectors) for _ in job.texts]
        except BaseException as e:  # (each job of the turn hears of it)
            for job in jobs:
                job.error = job.error or e
        finally:
            with self._state:
                for job in jobs:
                    job.done = True
                self.running -= len(jobs)
                self._busy = False
                self.last_used = time.monotonic()
                self._state.notify_all()

    def shutdown(self, grace_s: float = 0.0) -> None:
        """(A request's texts are one decode after another: nothing to cut short.)"""

    def close(self, grace_s: float = 0.0) -> None:
        """Free the context (the model is the pool's to close), after the turn running."""
        with self._state:
            while self._busy:
                self._state.wait()
            self._closed = True
            self.embedder.close()
