"""A request of batched generation (`infer batch`, `infer serve`): what it asks for, what each
step adds to it, and how it ended."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from infer.runtime.results import Completion
from infer.runtime.sampling import SamplingParams
from infer.runtime.thinking import ThinkingPlan


@dataclass
class TokenLogprob:
    """A generated token's log-probability under the model (before sampling's transforms),
    and the most likely alternatives at its position."""

    token: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass
class Delta:
    """What one step added to a request: final text, the tokens taken, their logprobs if asked."""

    text: str
    tokens: list[int]
    logprobs: list[TokenLogprob]


@dataclass(eq=False)
class Request:
    key: Any  # the caller's name for it (a line number, an id)
    tokens: list[int]
    params: SamplingParams
    logprobs: int | None = None  # None: none; N: each token's logprob and the N most likely
    on_delta: Callable[[Delta], None] | None = None  # called on the scheduler's thread
    cancelled: bool = False  # set from any thread: the request ends at the next step
    checkpoint: int = 0  # the prompt cache may save the state of tokens[:checkpoint] (0: never)
    thinking: ThinkingPlan | None = None  # a thinking model's reply: runtime/thinking.py
    media: Any = None  # runtime.media.MediaPrompt: the media in `tokens` (runs of pseudo-tokens)


@dataclass
class Outcome:
    key: Any
    completion: Completion | None = None
    error: str | None = None
    request: Request | None = None  # the request it ends


def token_logprob(logits: Any, token: int, top: int) -> TokenLogprob:
    """The log-probability of `token` under `logits` (a log-softmax), and the `top` likeliest."""
    import numpy as np

    shifted = logits.astype(np.float64) - float(logits.max())
    logp = shifted - np.log(np.exp(shifted).sum())
    best: list[tuple[int, float]] = []
    if top > 0:
        ids = np.argpartition(-logp, top)[:top]
        ids = ids[np.argsort(-logp[ids], kind="stable")]
        best = [(int(i), float(logp[i])) for i in ids]
    return TokenLogprob(token, float(logp[token]), best)
