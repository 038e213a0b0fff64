"""Room in the KV pool for the running requests (issue 34): the scheduler's side of one pool
of cells (runtime/kv_pool.py) shared by all slots.

A request is admitted when the cells its uncached prompt needs are free (idle slots' kept
caches count as free: they are evicted, least recently used first, and what other sequences
share stays), without reserving its token limit. When a step needs cells the pool does not
have, the most recently admitted request is suspended: its sequence's state is copied to host
memory (llama_state_seq_get_data) and its cells freed. Suspended requests resume, oldest first,
before any new one is admitted, once their cells are free again with a margin: their state is
loaded back (llama_state_seq_set_data, which needs a contiguous run of free cells), or, where
llama.cpp cannot place it, what they had decoded is computed again. Loading is a copy of the
cells (milliseconds) where computing them is a prefill (seconds for thousands of tokens on a
CPU): benchmarks/README.md, "The KV pool", so computing again is only the fallback.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from infer.runtime.kv_pool import CellPool
from infer.runtime.llama import Context
from infer.runtime.slot import Slot


class Room:
    """The KV cache of `context` as one pool of cells for `slots`: every change to a sequence's
    cells goes through here, so the count stays true."""

    def __init__(self, context: Context, slots: Sequence[Slot]) -> None:
        self.context, self.slots = context, slots
        self.pool = CellPool(context.n_ctx)
        self.margin = max(16, self.pool.size // 100)  # free cells a resumption or admission leaves
        self.preemptions = 0  # requests suspended
        self.recomputed = 0  # resumed by computing their cells again (their state did not load)
        self._order = itertools.count(1)

    # -- the cache's operations, mirrored in the pool's count ----------------------------------

    def rm(self, seq: int, start: int = 0) -> None:
        """Sequence `seq` gives up its positions from `start` on."""
        self.context.memory_seq_rm(seq, start, -1)
        self.pool.cut(seq, start)

    def cp(self, src: int, dst: int, n: int) -> None:
        """Empty sequence `dst` shares `src`'s first `n` positions (n < 0: all; across streams,
        llama.cpp copies whole sequences only)."""
        n = self.pool.held(src) if n < 0 else n
        self.context.memory_seq_cp(src, dst, 0, n if self.context.kv_unified else -1)
        self.pool.copy(src, dst, self.pool.held(src) if not self.context.kv_unified else n)

    def grew(self, slot: Slot) -> None:
        """The slot's sequence decoded up to its `n_past`."""
        self.pool.grow(slot.seq_id, slot.n_past - self.pool.held(slot.seq_id))

    def load(self, seq: int, data: bytes, n: int) -> bool:
        """Sequence `seq` (emptied) holds the `n` positions of a saved state; False (and empty)
        where llama.cpp does not take it."""
        self.rm(seq)
        if not self.context.set_seq_state(data, seq):
            self.context.memory_seq_rm(seq, 0, -1)
            return False
        self.pool.grow(seq, n)
        return True

    def clear(self) -> None:
        self.context.memory_clear()
        self.pool.clear()

    # -- admission, eviction, suspension -----------------------------------------------------

    def admission(self) -> int:
        """The order of a request admitted now."""
        return next(self._order)

    def admits(self, need: int) -> bool:
        """Whether a new request whose uncached prompt is `need` tokens may start now."""
        if any(s.suspended for s in self.slots):
            return False  # (they go first)
        running = self._running()
        if not running:
            return True
        return self.pool.free + self._evictable() >= self._needs(running)[1] + need + self.margin

    def make_room(self) -> None:
        """Before a step: suspended requests resumed where their cells are free, idle caches
        evicted for what the step could use, and the latest admitted requests suspended while
        the step lacks cells it must have (one token for each generating request and one for
        prefilling)."""
        self._resume()
        running = self._running()
        hard, soft = self._needs(running)
        self._evict(soft)
        while self.pool.free < hard and len(running) > 1:
            self._suspend(max(running, key=lambda s: s.admitted))
            running = self._running()
            hard, soft = self._needs(running)
            self._evict(hard)

    def _running(self) -> list[Slot]:
        return [s for s in self.slots if s.request is not None and not s.suspended]

    @staticmethod
    def _needs(running: Sequence[Slot]) -> tuple[int, int]:
        """The cells a step must have, and those the running requests' next steps would use."""
        generating = sum(1 + len(s.forced) for s in running if s.generating)
        prefill = sum(s.target - s.n_past for s in running if s.prefilling)
        return generating + (1 if prefill else 0), generating + prefill

    def _idle(self) -> list[Slot]:
        return sorted((s for s in self.slots if s.request is None and self.pool.held(s.seq_id)),
                      key=lambda s: s.used)

    def _evictable(self) -> int:
        return sum(self.pool.own(s.seq_id) for s in self._idle())

    def _evict(self, need: int) -> None:
        """Idle caches dropped, least recently used first, until `need` cells are free."""
        for slot in self._idle():
            if self.pool.free >= need:
                return
            if self.pool.own(slot.seq_id):
                self.rm(slot.seq_id)
                slot.cache = []

    def _suspend(self, slot: Slot) -> None:
        slot.saved = self.context.seq_state(slot.seq_id) if slot.n_past else b""
        self.rm(slot.seq_id)
        self.preemptions += 1

    def _resume(self) -> None:
        for slot in sorted((s for s in self.slots if s.suspended), key=lambda s: s.admitted):
            running = self._running()
            need = self._needs(running)[0] + slot.n_past + 1
            if running and self.pool.free + self._evictable() < need + self.margin:
                return
            self._evict(need)
            saved, slot.saved = slot.saved, None
            if slot.n_past and not self.load(slot.seq_id, saved or b"", slot.n_past):
                slot.target, slot.n_past = max(slot.target, slot.n_past), 0  # decoded again
                self.recomputed += 1
