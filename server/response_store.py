"""The responses `infer serve` keeps for OpenAI's Responses API (`store`, the default):
what `GET /v1/responses/{id}` returns and what `previous_response_id` continues. In memory,
the most recent `STORED_RESPONSES` of them (the oldest go first), lost when the server stops.

Each keeps the response object and its part of the conversation (its input and its output
as chat messages), linked to the response it continued: a conversation is that chain, so a
long one is held once, not once per turn. A response kept keeps the ones before it alive,
even once they have left the store or were deleted (as OpenAI's do, its conversation goes on).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

STORED_RESPONSES = 1000


@dataclass(frozen=True)
class Stored:
    """A stored response and the conversation it ended."""

    response: dict[str, Any]  # the response object, as GET returns it
    messages: tuple[dict[str, Any], ...]  # its input and its output, as chat messages
    previous: Stored | None = None  # the response it continued

    @property
    def id(self) -> str:
        return self.response["id"]

    def conversation(self) -> list[dict[str, Any]]:
        """The whole conversation this response ended, as chat messages (no instructions)."""
        parts = []
        at: Stored | None = self
        while at is not None:
            parts.append(at.messages)
            at = at.previous
        return [m for part in reversed(parts) for m in part]


class ResponseStore:
    """The most recent `limit` responses by id (a lock: any thread may use it)."""

    def __init__(self, limit: int = STORED_RESPONSES) -> None:
        self.limit = limit
        self._items: OrderedDict[str, Stored] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, stored: Stored) -> None:
        with self._lock:
            self._items[stored.id] = stored
            self._items.move_to_end(stored.id)
            while len(self._items) > self.limit:
                self._items.popitem(last=False)

    def get(self, response_id: str) -> Stored | None:
        with self._lock:
            return self._items.get(response_id)

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._items.pop(response_id, None) is not None
