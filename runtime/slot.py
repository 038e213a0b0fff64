"""One sequence of the scheduler's context and the request it serves, and its state as the
prompt cache sees it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from infer.runtime.generation import Generation
from infer.runtime.request import Delta, Request, TokenLogprob, token_logprob
from infer.runtime.results import Timings
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
        self.admitted = 0  # the order its request was admitted in (the pool preempts the latest)
        self.saved: bytes | None = None  # while suspended: its sequence's state (None: running)

    def start(self, request: Request, gen: Generation, cached: int, admitted: int = 0) -> None:
        self.request, self.gen, self.admitted = request, gen, admitted
        self.n_past = cached  # positions of this sequence in the KV cache
        self.target = len(request.tokens)  # what it decodes before it samples (more: recomputed)
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

    def tell(self, context: Any, base: int, taken_before: int, text: str) -> None:
        """Hand the request what this step added (tokens taken from output `base` on)."""
        request = self.request
        assert request is not None
        if request.on_delta is None:
            return
        tokens = self.gen.generated[taken_before:]
        logprobs = []
        if request.logprobs is not None:
            logprobs = [token_logprob(context.logits(base + i), token, request.logprobs)
                        for i, token in enumerate(tokens)]
        if text or tokens:
            request.on_delta(Delta(text, tokens, logprobs))

    def timings(self, t_end: float) -> Timings:
        assert self.request is not None
        return Timings(prefill_ms=(self.t_prefilled - self.t_start) * 1000,
                       decode_ms=(t_end - self.t_prefilled) * 1000,
                       ttft_ms=(self.t_first - self.t_start) * 1000,
                       prefill_tokens=len(self.request.tokens) - self.cached)

    def add_prefill(self, batch: Any, room: int, checkpoint: int) -> int:
        """Add the slot's next prefill chunk to `batch` (at most `room` tokens; its logits where
        the prompt ends, unless a sampled token waits: then the slot recomputes what it had);
        how many. A chunk ends at the `checkpoint`, so that the sequence then holds just that
        prefix (the prompt cache saves it), and before a medium (`prefill_media` next step)."""
        tokens, sampled = self.source(), self.next_token is not None
        end = min(self.n_past + room, checkpoint if self.n_past < checkpoint else self.target)
        end = next((pos for pos in range(self.n_past, end) if tokens[pos] < 0), end)
        index = None
        for pos in range(self.n_past, end):
            index = batch.add(tokens[pos], pos, self.seq_id, pos == self.target - 1 and not sampled)
        added, self.n_past = end - self.n_past, end
        if end == self.target and not sampled:
            self.logits_index = index
        return added

    def prefill_media(self, context: Any, room: Any, pooled: bool) -> int:
        """Where the slot's next prompt position is a medium's: the medium encoded and its
        embeddings decoded into its sequence now, by libmtmd's own decodes (a medium never
        shares a batch; the text before it is in the cache already), cells allowing. How many
        positions that filled."""
        request = self.request
        if not self.prefilling or self.next_token is not None or request is None or request.media is None:
            return 0
        start = self.n_past
        while self.n_past < self.target - 1 and request.tokens[self.n_past] < 0:
            chunk = request.media.media[request.tokens[self.n_past]]
            if pooled and room.pool.free < chunk.n_tokens:
                break  # (it waits for cells, as a text chunk does)
            request.media.projector.evaluate(context, chunk, self.n_past, self.seq_id, logits_last=False)
            self.n_past += chunk.n_tokens
            room.grew(self)
        return self.n_past - start

    @property
    def prefilling(self) -> bool:
        return self.request is not None and self.n_past < self.target

    @property
    def suspended(self) -> bool:
        return self.saved is not None

    @property
    def generating(self) -> bool:
        """It has a sampled token to decode (and is not recomputing what it had decoded)."""
        return self.next_token is not None and not self.prefilling

    def source(self) -> list[int]:
        """What its sequence holds once decoded: the prompt, then the tokens generated."""
        assert self.request is not None
        return self.request.tokens + self.gen.generated if self.gen.generated else self.request.tokens

    def decoded(self) -> list[int]:
        """The tokens at positions [0, n) of its sequence in the KV cache."""
        if self.request is None:
            return self.cache
        if self.suspended:  # (its cells were given up)
            return []
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
        slot = self.slot
        assert slot.request is None
        slot.cache = []
        if not self.scheduler.load_state(slot.seq_id, data, len(tokens)):
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


def waits_for_prefill(slots: list[Slot], tokens: Sequence[int]) -> bool:
    """Whether a request for `tokens` had better wait: a running slot is prefilling a longer
    prefix of them than any sequence holds now (the choices of one prompt)."""
    held = max((common_prefix_len(s.decoded(), tokens) for s in slots), default=0)
    return any(s.prefilling and s.request is not None
               and common_prefix_len(s.request.tokens, tokens) >= held + MIN_COPY for s in slots)
