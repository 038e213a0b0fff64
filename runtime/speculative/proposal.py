"""What a proposer is and what it proposes: ``Proposer`` and ``Proposal``."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass
class Proposal:
    tokens: list[int]
    keys: list[Hashable]  # what backs each guess, for Acceptance (a draft model: none)


class Proposer(Protocol):
    """What guesses tokens: it follows the history and proposes up to k_max tokens."""

    def sync(self, tokens: Sequence[int]) -> None: ...
    def extend(self, tokens: Sequence[int]) -> None: ...
    def propose(self, k_max: int) -> Proposal | None: ...
