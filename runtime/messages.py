"""A chat's messages and the edits the chat commands make to them, with nothing of a model
loaded: a local Conversation and a chat sent to a server (cli/chat_remote.py) share it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from infer.runtime.errors import UsageError

# When the next turn would not fit the context: drop the oldest exchanges, or fail the turn.
CONTEXT_POLICIES = ("drop-oldest", "error")


def check_context_policy(policy: str) -> str:
    if policy not in CONTEXT_POLICIES:
        raise UsageError(f"context policy must be one of {', '.join(CONTEXT_POLICIES)}")
    return policy


@dataclass(frozen=True)
class Dropped:
    """Oldest exchanges were dropped so that the next turn fits the context."""

    exchanges: int


class Messages:
    """Messages in order, the system prompt (if any) first."""

    def __init__(self, system: str | None = None) -> None:
        self.messages: list[dict[str, Any]] = []
        self.set_system(system)

    @property
    def system(self) -> str | None:
        if self.messages and self.messages[0]["role"] == "system":
            return str(self.messages[0]["content"])
        return None

    def set_system(self, text: str | None) -> None:
        """Replace the system prompt (None removes it); the rest of the conversation stays."""
        rest = [m for m in self.messages if m["role"] != "system"]
        self.messages = ([{"role": "system", "content": text}] if text else []) + rest

    def clear(self) -> None:
        """A new conversation with the same system prompt."""
        self.messages = self.messages[:1] if self.system is not None else []

    def undo(self) -> bool:
        """Remove the last exchange (user message and reply); False if there is none."""
        last_user = self._last_user_index()
        if last_user is None:
            return False
        del self.messages[last_user:]
        return True

    def drop_oldest(self) -> bool:
        """Drop the oldest exchange (never the system prompt nor the last user message);
        False if there is none to drop."""
        first = 1 if self.system is not None else 0
        last_user = self._last_user_index()
        if last_user is None or last_user <= first:
            return False
        end = next(i for i in range(first + 1, len(self.messages)) if self.messages[i]["role"] == "user")
        del self.messages[first:end]
        return True

    def recorded(self, events: Iterable[Any]) -> Iterator[Any]:
        """Pass a reply's events on (Piece ..., Completion) and add the reply to the messages;
        if it is interrupted (Ctrl-C), what was said so far is the reply."""
        from infer.runtime.results import Completion, Piece

        said: list[str] = []
        completed = False
        try:
            for event in events:
                if isinstance(event, Piece):
                    said.append(event.text)
                elif isinstance(event, Completion):
                    self.messages.append(event.message())
                    completed = True
                yield event
        finally:
            if not completed:
                self.messages.append({"role": "assistant", "content": "".join(said)})

    def _last_user_index(self) -> int | None:
        for i in range(len(self.messages) - 1, -1, -1):
            if self.messages[i]["role"] == "user":
                return i
        return None
