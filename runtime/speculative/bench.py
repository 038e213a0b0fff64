"""For benchmarks and tests of the policy without a model: ``follow`` drives a speculator
over a reply already written."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from infer.runtime.speculative.policy import Speculator


def follow(speculator: Speculator, prompt: Sequence[int], reply: Sequence[int]) -> Iterator[tuple[int, int]]:
    """Drive `speculator` over a reply already written, as Session.generate does with a model
    that writes it (a guess is right where it equals the reply): each step's (guesses, right).
    For benchmarks and tests of the policy without a model."""
    speculator.start(prompt)
    pos = 0
    while pos < len(reply):
        speculator.extend([reply[pos]])
        room = len(reply) - pos - 1
        guesses = speculator.propose(room) if room > 0 else []
        right = 0
        while right < len(guesses) and guesses[right] == reply[pos + 1 + right]:
            right += 1
        speculator.verified(len(guesses), right)
        speculator.extend(guesses[:right])
        yield len(guesses), right
        pos += right + 1
