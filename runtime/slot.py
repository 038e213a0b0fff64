"""One sequence of the scheduler's context and the request it serves, and its state as the
prompt cache sees it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from infer.runtime.generation import Generation
from infer.runtime.request import Delta, Request, TokenLogprob
from infer.runtime.session import common_prefix_len
from infer.runtime.speculative import Speculator

PREFIX_SEQ = 0  # the shared prefix's own sequence; slots are then sequences 1..parallel
MIN_COPY = 16  # a prefix held by another slot is copied when it saves at least this many tokens


class Slot:
    """One sequence of the context and the request it is serving."""

    def __init__(self, seq_id: int, spec: Speculator | None) -> None:
        self.seq_id = seq_id
        self.request: Request | None = None
        self.spec = spec  # kept from request to request: what it learned carries over
        self.cache: list[int] = []  # while free: the tokens its KV cells hold (keep_cache)
        self.used = 0.0  # when its last request ended, to reuse the oldest cache first

    def start(self, request: Request, gen: Generation, cached: int) -> None:
        self.request, self.gen = request, gen
        self.n_past = cached  # positions of this sequence in the KV cache
        self.cached = cached
        self.next_token: int | None = None  # sampled, to be decoded in the next step
        self.logits_index: int | None = None  # where this slot's logits are in the batch just decoded
        self.guesses: list[int] = []  # decoded after next_token in the batch just decoded
        self.forced: list[int] = []  # written after next_token (a closing marker: runtime/thinking.py)
        if self.spec is not None:
            self.spec.start(request.tokens)
        self.t_start = time.perf_counter()
        self.t_prefilled = self.t_first = self.t_start

    def close_thinking(self, token: int) -> str | None:
        """The reasoning budget is spent: after the pending `token` the slot writes the closing
        marker itself (decoded with it at the next step), as if the model had. Why the request
        ends with it, if it does (the token limit)."""
        request = self.request
        assert request is not None
        text, closer, ended = self.gen.write_closer(token)
        if request.on_delta is not None:  # (written, not sampled: a log-probability of 0)
            request.on_delta(Delta(text, closer, [TokenLogprob(t, 0.0, []) for t in closer]
                                   if request.logprobs is not None else []))
        self.next_token, self.forced = token, closer
        return ended

    @property
    def prefilling(self) -> bool:
        return self.request is not None and self.n_past < len(self.request.tokens)

    def decoded(self) -> list[int]:
        """The tokens at positions [0, n) of its sequence in the KV cache."""
        if self.request is None:
            return self.cache
        return (self.request.tokens + self.gen.generated)[:self.n_past]


class SlotState:
    """A slot's sequence as the prompt cache sees it (a `prompt_cache.StateHolder`)."""

    def __init__(self, scheduler: Any, slot: Slot) -> None:
        self.scheduler, self.slot = scheduler, slot

    def fingerprint(self) -> dict[str, object]:
        return self.scheduler.fingerprint

    def save_state(self) -> tuple[list[int], bytes]:
        context, slot = self.scheduler.context, self.slot
        return list(slot.decoded()), context.seq_state(slot.seq_id)

    def restore_state(self, tokens: list[int], data: bytes) -> bool:
        """Load a state into the (free) slot's sequence; False (and an empty slot) if it does not load."""
        context, slot = self.scheduler.context, self.slot
        assert slot.request is None
        context.memory_seq_rm(slot.seq_id, 0, -1)
        slot.cache = []
        if not context.set_seq_state(data, slot.seq_id):
            context.memory_seq_rm(slot.seq_id, 0, -1)
            return False
        slot.cache = list(tokens)
        return True


def place(slots: list[Slot], tokens: Sequence[int], prefix: Sequence[int], *,
          keep_cache: bool) -> tuple[Slot, int | None, int]:
    """The free slot for `tokens`, the sequence to copy a prefix from (None: the slot's own
    cells), and how many tokens are already there."""
    free = [s for s in slots if s.request is None]
    if prefix:
        shared = common_prefix_len(tokens, prefix)
        return free[0], PREFIX_SEQ if shared else None, shared
    if not keep_cache:
        return free[0], None, 0
    # Its own cache if it holds the longest prefix; the oldest cache is the one to give up.
    slot = max(free, key=lambda s: (common_prefix_len(s.cache, tokens), -s.used))
    own = common_prefix_len(slot.cache, tokens)
    donor, best = None, own
    for other in slots:
        n = common_prefix_len(other.decoded(), tokens)
        if other is not slot and n >= best + MIN_COPY:
            donor, best = other, n
    if donor is None:
        return slot, None, own
    spare = [s for s in free if s is not donor]
    if not spare:  # the donor is the only free slot: it keeps what it holds
        return donor, None, best
    slot = min(spare, key=lambda s: (common_prefix_len(s.cache, tokens), s.used))
    return slot, donor.seq_id, best
