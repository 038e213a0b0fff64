"""The KV cache's cells as one pool (issue 34), counted as llama.cpp's unified cache holds them.

Every sequence draws cells from one buffer of `size`: a sequence holds one cell per position
from 0 on, a copy of another's prefix (`llama_memory_seq_cp`) shares that prefix's cells
rather than taking new ones, and a cell is free again once no sequence holds it. llama.h
tells neither how many cells are in use nor which are shared, so the scheduler mirrors each
operation it asks of the cache here, and admits, evicts and preempts by these counts.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable


class CellPool:
    """The cells of `size` as the sequences hold them."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._held: dict[int, list[int]] = {}  # each sequence's cells, by position
        self._refs: Counter[int] = Counter()  # how many sequences hold each cell in use
        self._ids = itertools.count()

    @property
    def used(self) -> int:
        return len(self._refs)

    @property
    def free(self) -> int:
        return self.size - self.used

    def held(self, seq: int) -> int:
        """The positions sequence `seq` holds."""
        return len(self._held.get(seq, ()))

    def own(self, seq: int) -> int:
        """The cells only `seq` holds: what freeing it gives back."""
        return sum(self._refs[cell] == 1 for cell in self._held.get(seq, ()))

    def grow(self, seq: int, n: int) -> None:
        """`seq` decoded `n` more positions (new cells)."""
        cells = self._held.setdefault(seq, [])
        for _ in range(n):
            cell = next(self._ids)
            cells.append(cell)
            self._refs[cell] = 1

    def copy(self, src: int, dst: int, n: int) -> None:
        """`dst` (empty) shares `src`'s first `n` positions."""
        assert not self._held.get(dst), "a copy goes to an empty sequence"
        cells = self._held.get(src, [])[:n]
        self._held[dst] = list(cells)
        for cell in cells:
            self._refs[cell] += 1

    def cut(self, seq: int, start: int = 0) -> None:
        """`seq` gives up its positions from `start` on."""
        cells = self._held.get(seq, [])
        for cell in cells[start:]:
            self._refs[cell] -= 1
            if not self._refs[cell]:
                del self._refs[cell]
        del cells[start:]

    def clear(self) -> None:
        self._held.clear()
        self._refs.clear()


def fits_shares(n_ctx: int, streams: int, prefix: int, needs: Iterable[int]) -> bool:
    """Whether every request fits a KV stream of its own: `needs` are their prompts with their
    token limits, and each of `streams` holds n_ctx / streams cells, the shared `prefix` among
    them. Where they do (a batch of like lines), split streams decode faster than one pool
    (benchmarks/README.md, "The KV pool"); where one does not, the pool lets it run."""
    share = n_ctx // max(streams, 1)
    return all(prefix + need <= share for need in needs)
