"""A model served to many callers at once: the scheduler on a thread of its own.

The engine's thread owns llama.cpp's context: it admits requests into free slots
between steps (a request joins the running batch at the next step, not after the
current ones), decodes, and hands each request what every step added. Callers on
other threads `submit` and `cancel`; they hear back through callbacks that run on
the engine's thread and must not block (a server passes them to its event loop).
Nothing here knows HTTP.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from infer.runtime.errors import InferError
from infer.runtime.llama import Context, Model
from infer.runtime.log import logger
from infer.runtime.params import ContextParams
from infer.runtime.prompt_cache import PromptCache
from infer.runtime.request import Outcome, Request
from infer.runtime.scheduler import Scheduler
from infer.runtime.speculative import SpecParams

log = logger("infer.engine")


class Busy(InferError):
    """More requests are waiting than the engine queues."""


class Closed(InferError):
    """The engine is shutting down and takes no more requests."""


@dataclass(eq=False)
class Job:
    request: Request
    on_done: Callable[[Outcome], None]  # called once, on the engine's thread


class Engine:
    """`parallel` requests at a time through one context of `model` (which the caller owns)."""

    def __init__(self, model: Model, params: ContextParams, *, parallel: int,
                 speculation: SpecParams | None = None, max_waiting: int | None = None,
                 prompt_cache: PromptCache | None = None, cache_name: str = "") -> None:
        # The KV cache is one pool of cells for all slots (runtime/preemption.py): a request may
        # use the whole context, and what the slots keep between requests stays until needed.
        self.context = Context(model, replace(params, n_seq_max=parallel, kv_unified=True))
        try:
            self.scheduler = Scheduler(model, self.context, parallel=parallel, speculation=speculation,
                                       keep_cache=True, prompt_cache=prompt_cache, cache_name=cache_name)
        except BaseException:
            self.context.close()
            raise
        self.model = model
        self.prompt_cache = prompt_cache  # long prompt prefixes on disk (None: not used)
        self.parallel = parallel
        self.max_waiting = max_waiting
        self._inbox: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._waiting: deque[Job] = deque()
        # Counted under the lock, and moved from one to the other in one step, so that a reader
        # never sees a request in neither (a stop report, or the pool asking whether it is idle).
        self._pending = 0  # submitted, not yet in a slot (the inbox and the waiting line)
        self._admitted = 0  # in a slot, its outcome not yet delivered
        self._lock = threading.Lock()
        self._jobs: dict[int, Job] = {}  # running, by id of their request
        self._closing = False
        self._deadline: float | None = None
        # What a shutdown ended: running requests cut at the end of the grace period, and
        # waiting ones refused.
        self.cut_off = 0
        self.refused = 0
        self.last_used = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="infer-engine", daemon=True)
        self._thread.start()

    # -- what callers on other threads use ------------------------------------------------

    @property
    def slot_cells(self) -> int:
        """The context one request may use: its prompt and its generated tokens."""
        return self.scheduler.slot_cells

    @property
    def waiting(self) -> int:
        return self._pending

    @property
    def running(self) -> int:
        return self._admitted

    @property
    def kv_usage(self) -> float:
        """The share of the KV cache's cells that hold tokens (running requests and kept caches)."""
        return self.scheduler.cells_used / max(self.context.n_ctx, 1)

    @property
    def preemptions(self) -> int:
        """Requests suspended so far because the running ones needed their cells."""
        return self.scheduler.room.preemptions

    def fit_error(self, n_tokens: int, max_tokens: int | None) -> str | None:
        return self.scheduler.fit_error(n_tokens, max_tokens)

    def submit(self, request: Request, on_done: Callable[[Outcome], None]) -> None:
        """Queue `request`; raises Busy if `max_waiting` are already waiting, Closed when closing."""
        with self._lock:
            if self._closing:
                raise Closed("the server is shutting down")
            if self.max_waiting is not None and self._pending >= self.max_waiting + self.scheduler.free_slots:
                raise Busy(f"{self._pending} requests are already waiting")
            self._pending += 1
        self.last_used = time.monotonic()
        self._inbox.put(Job(request, on_done))

    def cancel(self, request: Request) -> None:
        """End `request` at the next step (its outcome says "cancelled"), or before it starts."""
        request.cancelled = True
        self._inbox.put(None)  # wakes an idle engine

    def shutdown(self, grace_s: float = 0.0) -> None:
        """Take no more requests; let running ones go on for up to `grace_s` seconds, then end
        them ("cancelled"). Waiting requests end at once. Returns at once."""
        with self._lock:
            deadline = time.monotonic() + grace_s
            if not self._closing or (self._deadline is not None and deadline < self._deadline):
                self._deadline = deadline
            self._closing = True
        self._inbox.put(None)

    def close(self, grace_s: float = 0.0) -> None:
        """`shutdown`, then wait for the running requests to end and free the context."""
        self.shutdown(grace_s)
        self._thread.join()
        self.scheduler.close()
        self.context.close()
        if self.prompt_cache is not None:
            self.prompt_cache.flush()

    @property
    def idle(self) -> bool:
        with self._lock:
            return not self._pending and not self._admitted

    # -- the engine's thread ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            busy = bool(self.scheduler.running or self._waiting)
            # Never block once closing: shutdown's one wake-up may have been taken while requests
            # still ran, and nothing else comes. (Set before that wake-up is put, `_closing` is
            # seen here, or the wake-up is still in the inbox.)
            self._take_inbox(block=not busy and not self._closing)
            if self._closing:
                self._refuse_waiting()
                if not self.scheduler.running:
                    return
                if self._deadline is not None and time.monotonic() >= self._deadline:
                    for job in self._jobs.values():
                        self.cut_off += not job.request.cancelled
                        job.request.cancelled = True
            self._admit()
            if not self.scheduler.running:
                if self._waiting:  # waiting for nothing: cannot happen, but never spin
                    time.sleep(0.001)
                continue
            try:
                outcomes = self.scheduler.step()
            except Exception as e:  # llama.cpp failed: the running requests fail, the engine goes on
                log.exception("a decode step failed")
                outcomes = self._fail_running(f"the model failed: {e}")
            for outcome in outcomes:
                assert outcome.request is not None
                self._deliver(self._jobs.pop(id(outcome.request)), outcome)
                with self._lock:  # (after its caller heard: never idle before that)
                    self._admitted -= 1

    def _take_inbox(self, *, block: bool) -> None:
        try:
            item = self._inbox.get(block=block, timeout=None if block else 0)
        except queue.Empty:
            return
        while True:
            if item is not None:
                self._waiting.append(item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _admit(self) -> None:
        """Move waiting requests into free slots, in order, while the cells of their prompts
        are free (a request whose prompt another is prefilling waits for it, and lets those
        behind it go first)."""
        skipped: list[Job] = []
        while self._waiting and self.scheduler.free_slots:
            job = self._waiting.popleft()
            request = job.request
            if request.cancelled:
                self._deliver(job, Outcome(request.key, error="cancelled", request=request))
                self._unqueue()
                continue
            if self.scheduler.waits_for_prefill(request.tokens):
                skipped.append(job)
                continue
            if not self.scheduler.admits(request.tokens):
                self._waiting.appendleft(job)
                break
            with self._lock:
                self._pending -= 1
                self._admitted += 1
            try:
                error = self.scheduler.add(request)
            except Exception as e:  # a bug or llama.cpp failing: this request fails, the engine goes on
                log.exception("starting a request failed")
                error = Outcome(request.key, error=f"the model failed: {e}", request=request)
            if error is not None:
                self._deliver(job, error)
                with self._lock:
                    self._admitted -= 1
            else:
                self._jobs[id(request)] = job
        self._waiting.extendleft(reversed(skipped))

    def _unqueue(self) -> None:
        with self._lock:
            self._pending -= 1

    def _refuse_waiting(self) -> None:
        while self._waiting:
            job = self._waiting.popleft()
            self.refused += 1
            self._deliver(job, Outcome(job.request.key, error="the server is shutting down",
                                       request=job.request))
            self._unqueue()

    def _fail_running(self, message: str) -> list[Outcome]:
        self.scheduler.abort()
        return [Outcome(job.request.key, error=message, request=job.request) for job in self._jobs.values()]

    def _deliver(self, job: Job, outcome: Outcome) -> None:
        try:
            job.on_done(outcome)
        except Exception:  # a caller's callback must not stop the engine
            log.exception("a request's on_done failed")
