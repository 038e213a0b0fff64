"""How often proposals are right: ``Acceptance``, learned per kind of guess as the text goes."""

from __future__ import annotations

from collections.abc import Hashable, Sequence


class Acceptance:
    """How often a guess is right, by what backed it (its key), learned as the text goes.

    Prompt lookup gives each guess a key (see ``PromptLookup``): a copy of an earlier
    passage that has matched for m tokens, or the statistics of what followed the last n
    tokens before. Every guess is scored against the tokens that come, whether or not
    it was verified (``Speculator`` keeps each step's whole proposal until the text
    has passed it), up to and including its first wrong one, so a kind of guess that
    the costs rule out is still measured. A key starts from a prior worth a few
    observations, never more than the acceptance of all guesses so far, so that a text
    that does not repeat its input stops speculation under every key at once.
    """

    PRIOR_WEIGHT = 3.0
    OVERALL_PRIOR = (0.9, 4.0)  # (rate, weight) before anything was tested: worth trying
    # Each step, the overall counts fade by this much: the overall rate follows the
    # stretch of text being written (half in ~35 steps), and a text that starts
    # repeating itself later is trusted again.
    FADE = 0.98

    def __init__(self) -> None:
        self.tested: dict[Hashable, float] = {}
        self.accepted: dict[Hashable, float] = {}
        self._all = [0.0, 0.0]  # accepted, tested

    def overall(self) -> float:
        rate, weight = self.OVERALL_PRIOR
        return (self._all[0] + rate * weight) / (self._all[1] + weight)

    def rate(self, key: Hashable) -> float:
        prior = min(_prior(key), self.overall())
        return ((self.accepted.get(key, 0.0) + prior * self.PRIOR_WEIGHT)
                / (self.tested.get(key, 0.0) + self.PRIOR_WEIGHT))

    def record(self, key: Hashable, right: bool) -> None:
        """One guess under `key` was scored (its guesses before it were right)."""
        self.tested[key] = self.tested.get(key, 0.0) + 1
        self._all[1] += 1
        if right:
            self.accepted[key] = self.accepted.get(key, 0.0) + 1
            self._all[0] += 1

    def observe(self, keys: Sequence[Hashable], accepted: int) -> None:
        """The guesses under `keys` were scored in order and the first `accepted` were right."""
        for i, key in enumerate(keys[:accepted + 1]):
            self.record(key, i < accepted)

    def fade(self) -> None:
        """A step was taken."""
        self._all[0] *= self.FADE
        self._all[1] *= self.FADE


def _prior(key: Hashable) -> float:
    """What a guess under `key` is expected to be worth before any was tested: optimistic
    enough for a likely kind to be tried (and then measured), not so much that a text
    without repeats pays for many tries."""
    if isinstance(key, tuple) and key and key[0] in ("copy", "edited"):
        return 1.0 - 1.0 / key[1]  # a long copy goes on: 0.875 at 8 tokens, 0.97 at 32
    if isinstance(key, tuple) and key and key[0] == "edit":
        return (0.6, 0.75, 0.85, 0.9)[key[1]]  # an edit that came true before is likely again
    if isinstance(key, tuple) and key and key[0] == "ngram":
        _, n, agree, seen = key
        sure = min(0.3 + 0.1 * n + 0.125 * (seen - 1), 0.95)  # a 4-gram: 0.7 seen once, 0.95 thrice
        return sure * agree / 100
    return 0.8
