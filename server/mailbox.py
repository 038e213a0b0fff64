"""What the engine's thread produces reaches the request's handler through a `Mailbox`:
the engine never waits for a reader, and a slow reader only lets text pile up (at most its
token limit)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

from infer.runtime.request import Delta, Outcome


class Mailbox:
    """What the engine's thread hands one HTTP request: (choice, Delta or Outcome) items."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: list[tuple[int, Delta | Outcome]] = []
        self._lock = threading.Lock()
        self._woken = asyncio.Event()
        self._scheduled = False

    def put(self, choice: int, item: Delta | Outcome) -> None:  # on the engine's thread
        with self._lock:
            self._items.append((choice, item))
            if self._scheduled:
                return
            self._scheduled = True
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is reading any more
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        with self._lock:
            self._scheduled = False
        self._woken.set()

    async def take(self) -> list[tuple[int, Delta | Outcome]]:
        while True:
            with self._lock:
                items, self._items = self._items, []
            if items:
                return items
            self._woken.clear()
            await self._woken.wait()

    def sender(self, choice: int) -> Callable[[Any], None]:
        """A callback that puts what the engine hands it in this mailbox, as `choice`'s."""
        return lambda item: self.put(choice, item)
