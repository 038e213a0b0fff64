"""Incremental detokenization with stop strings.

Token pieces arrive as bytes; a multi-byte UTF-8 character may be split across
pieces, and a stop string may be split across pieces too. ``TextStream`` only
releases text that is final: complete characters that cannot be the start of a
stop string. The stop string itself is never released.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class TextStream:
    """Turns token bytes into printable text, holding back what may still change."""

    def __init__(self, stop: Sequence[str] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = tuple(stop)
        self._longest = max((len(s) for s in self._stop), default=0)
        self._pending = ""  # decoded text not yet released
        self.text = ""  # everything released so far
        self.stopped_by: str | None = None

    def set_stops(self, stop: Sequence[str]) -> None:
        """Look for these stop strings in the text from now on (a thinking model's answer)."""
        self._stop = tuple(stop)
        self._longest = max((len(s) for s in self._stop), default=0)

    def feed(self, data: bytes) -> str:
        """Add one token's bytes; return the text that is now safe to print."""
        if self.stopped_by is not None:
            return ""
        self._pending += self._decoder.decode(data)
        if not self._stop:
            return self._release(len(self._pending))
        hit = self._find_stop()
        if hit is not None:
            index, stop = hit
            self.stopped_by = stop
            return self._release(index, drop_rest=True)
        return self._release(len(self._pending) - self._held_back())

    def finish(self) -> str:
        """The end of generation: release whatever is left (an incomplete byte becomes U+FFFD)."""
        if self.stopped_by is not None:
            return ""
        self._pending += self._decoder.decode(b"", final=True)
        hit = self._find_stop()
        if hit is not None:
            self.stopped_by = hit[1]
            return self._release(hit[0], drop_rest=True)
        return self._release(len(self._pending))

    def _find_stop(self) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for stop in self._stop:
            i = self._pending.find(stop)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, stop)
        return best

    def _held_back(self) -> int:
        """Length of the longest tail of the pending text that begins some stop string."""
        tail_max = min(len(self._pending), self._longest - 1)
        for n in range(tail_max, 0, -1):
            tail = self._pending[-n:]
            if any(stop.startswith(tail) for stop in self._stop):
                return n
        return 0

    def _release(self, n: int, drop_rest: bool = False) -> str:
        out, self._pending = self._pending[:n], ("" if drop_rest else self._pending[n:])
        self.text += out
        return out
