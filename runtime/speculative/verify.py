"""Verification: ``verify`` checks a step's guesses against the request's own sampler chain."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infer.runtime.llama import Context, SamplerChain


def verify(chain: SamplerChain, context: Context, base: int, guesses: Sequence[int],
           take: Callable[[int], bool],
           on_sample: Callable[[int], None] | None = None) -> tuple[int, int | None]:
    """Check guesses against the request's own sampler chain, one sample per position.

    The batch just decoded holds the pending token at output `base` and the guesses after
    it. The chain samples at each output in turn while the sample equals the guess there;
    `take(token)` receives every accepted guess and says whether generation ends with it.
    Returns how many guesses were accepted and the token sampled after them (the first
    mismatch, or one more when all were right), None if generation ended inside the run.
    `on_sample(output)` is called before each sample (for tests that inspect the logits).
    """
    for i, guess in enumerate(guesses):
        if on_sample is not None:
            on_sample(base + i)
        token = chain.sample(context, base + i)
        if token != guess:
            return i, token
        if take(token):
            return i + 1, None
    if on_sample is not None:
        on_sample(base + len(guesses))
    return len(guesses), chain.sample(context, base + len(guesses))
