"""Continuous batching: many requests decoded together in one context.

Every step is one ``llama_decode`` of one batch that holds the next token of
every slot that is generating, plus prefill chunks of slots that are starting,
within ``n_batch``. When a request finishes, its slot's cells are removed and
the next waiting request takes the slot at once (continuous batching, not waves).

A prefix shared by the requests (a system prompt, a template's preamble) is
prefilled once into a sequence of its own; each slot starts from a copy of it
(``llama_memory_seq_cp``: the cells are shared, not recomputed).

Each request has its own sampler chain (its own parameters and seed) and its
own stop strings. llama.cpp does not promise bit-identical logits across batch
shapes, so a request's text can differ from a solo run's where two candidate
tokens are nearly tied; the tests check logits against solo runs within 1e-3.

With speculation (prompt lookup), a generating slot may add guessed tokens after
its next token, verified with its own chain as ``Session.generate`` does. The
draft length weighs what the guesses are expected to add to the step's output
(one token per generating slot) against what the larger batch costs, as measured
on this run's steps: with many slots a step is already wide and guesses rarely pay.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from infer.runtime.errors import InferError
from infer.runtime.llama import Batch, Context, Model
from infer.runtime.sampling import SamplingParams, build_sampler_chain
from infer.runtime.session import Completion, Timings, Usage, common_prefix_len, take_token
from infer.runtime.speculative import CostModel, SpecParams, Speculator, verify
from infer.runtime.textstream import TextStream

PREFIX_SEQ = 0  # the shared prefix's own sequence; slots are sequences 1..parallel


@dataclass
class Request:
    key: Any  # the caller's name for it (a line number, an id)
    tokens: list[int]
    params: SamplingParams


@dataclass
class Outcome:
    key: Any
    completion: Completion | None = None
    error: str | None = None


class _Slot:
    """One sequence of the context and the request it is serving."""

    def __init__(self, seq_id: int, spec: Speculator | None) -> None:
        self.seq_id = seq_id
        self.request: Request | None = None
        self.spec = spec  # kept from request to request: what it learned carries over

    def start(self, request: Request, params: SamplingParams, chain: Any, cached: int, limit: int) -> None:
        self.request, self.params, self.chain = request, params, chain
        self.n_past = cached  # positions of this sequence in the KV cache
        self.cached = cached
        self.limit = limit
        self.generated: list[int] = []
        self.stream = TextStream(params.stop)
        self.next_token: int | None = None  # sampled, to be decoded in the next step
        self.logits_index: int | None = None  # where this slot's logits are in the batch just decoded
        self.guesses: list[int] = []  # decoded after next_token in the batch just decoded
        self.drafted = self.accepted = 0
        if self.spec is not None:
            self.spec.start(request.tokens)
        self.t_start = time.perf_counter()
        self.t_prefilled = self.t_first = self.t_start

    @property
    def prefilling(self) -> bool:
        return self.request is not None and self.n_past < len(self.request.tokens)


class Scheduler:
    """Runs requests `parallel` at a time in `context` (which needs n_seq_max >= parallel + 1).

    Each slot may use an equal share of the context's cells beyond the shared prefix
    (with a unified KV cache), or its sequence's stream less the prefix (without);
    a request whose prompt and token limit do not fit fails on its own.
    """

    def __init__(self, model: Model, context: Context, *, parallel: int,
                 shared_prefix: Sequence[int] = (), speculation: SpecParams | None = None) -> None:
        if parallel < 1:
            raise ValueError("parallel must be at least 1")
        if speculation is not None and speculation.type == "draft":
            raise ValueError("the scheduler speculates with prompt lookup only")
        self.model, self.context = model, context
        self.batch = Batch(context.n_batch)
        self.costs = CostModel(self.batch.capacity)  # steps of generating slots only
        self.slots = [_Slot(seq_id, Speculator(speculation) if speculation and speculation.enabled else None)
                      for seq_id in range(1, parallel + 1)]
        for slot in self.slots:  # one acceptance for all: the requests of a batch are usually alike
            if slot.spec is not None and self.slots[0].spec is not None:
                slot.spec.acceptance = self.slots[0].spec.acceptance
        self.prefix = list(shared_prefix)
        if context.kv_unified:  # the prefix's cells are shared; the rest is split evenly
            self.slot_cells = (context.n_ctx - len(self.prefix)) // parallel
        else:  # each sequence's stream holds its own copy of the prefix
            self.slot_cells = context.n_ctx_seq - len(self.prefix)
        self.prefilled_tokens = 0  # every prompt token decoded, the shared prefix included

    def close(self) -> None:
        self.batch.close()

    def run(self, requests: Iterable[Request],
            on_logits: Callable[[Any, int, Any], None] | None = None) -> Iterator[Outcome]:
        """Yield each request's outcome as soon as it is done (not in input order).

        `on_logits(key, step, logits)` sees every logits vector a request samples from
        (step 0 is the first generated token): for tests.
        """
        self.context.memory_clear()
        if self.prefix:
            self._prefill_prefix()
        try:
            yield from self._loop(iter(requests), on_logits)
        finally:  # also when the caller stops early (Ctrl-C): free what the running requests hold
            for slot in self.slots:
                if slot.request is not None:
                    slot.chain.close()
                    slot.request = None

    def _loop(self, waiting: Iterator[Request],
              on_logits: Callable[[Any, int, Any], None] | None) -> Iterator[Outcome]:
        queued: deque[Outcome] = deque()
        exhausted = False
        while True:
            for slot in self.slots:
                while slot.request is None and not exhausted:
                    request = next(waiting, None)
                    if request is None:
                        exhausted = True
                    else:
                        error = self._assign(slot, request)
                        if error is not None:
                            queued.append(error)
            while queued:
                yield queued.popleft()
            active = [s for s in self.slots if s.request is not None]
            if not active:
                return
            self._step(active)
            for slot in active:
                if slot.logits_index is not None:
                    done = self._sample(slot, on_logits)
                    if done is not None:
                        yield done

    def _prefill_prefix(self) -> None:
        n_batch = self.batch.capacity
        for start in range(0, len(self.prefix), n_batch):
            self.batch.clear()
            for i, token in enumerate(self.prefix[start:start + n_batch]):
                self.batch.add(token, start + i, PREFIX_SEQ, False)
            self.context.decode(self.batch)
        self.prefilled_tokens += len(self.prefix)

    def _assign(self, slot: _Slot, request: Request) -> Outcome | None:
        """Give `request` to `slot`; an Outcome with an error if it cannot run."""
        tokens = request.tokens
        if not tokens:
            return Outcome(request.key, error="the prompt is empty")
        shared = common_prefix_len(tokens, self.prefix) if self.prefix else 0
        if shared == len(tokens):
            shared -= 1  # the last prompt token is decoded in the slot, for its logits
        own = len(tokens) - shared
        max_tokens = request.params.max_tokens
        room = self.slot_cells - own
        if room < 1 or (max_tokens is not None and max_tokens > room):
            wanted = own + (max_tokens or 1)
            return Outcome(request.key, error=(
                f"the prompt needs {wanted} tokens of context with its token limit but each of the "
                f"{len(self.slots)} parallel slots has {self.slot_cells} (raise -c or lower --parallel)"))
        try:
            params = request.params.with_seed()
            chain = build_sampler_chain(params, self.model)
        except InferError as e:
            return Outcome(request.key, error=str(e))
        self.context.memory_seq_rm(slot.seq_id, 0, -1)
        if shared and self.context.kv_unified:
            self.context.memory_seq_cp(PREFIX_SEQ, slot.seq_id, 0, shared)
        elif shared:  # across streams llama.cpp copies whole sequences only
            self.context.memory_seq_cp(PREFIX_SEQ, slot.seq_id, 0, -1)
            if shared < len(self.prefix):
                self.context.memory_seq_rm(slot.seq_id, shared, -1)
        slot.start(request, params, chain, shared, room if max_tokens is None else max_tokens)
        return None

    def _step(self, active: list[_Slot]) -> None:
        """One decode: the next token of each generating slot (and its guesses), then prefill
        chunks as room allows."""
        batch = self.batch
        batch.clear()
        generating = [slot for slot in active if slot.next_token is not None]
        for slot in active:
            slot.logits_index = None
        for i, slot in enumerate(generating):
            assert slot.next_token is not None
            slot.logits_index = batch.add(slot.next_token, slot.n_past, slot.seq_id, True)
            slot.n_past += 1
            slot.guesses = self._guesses(slot, len(generating) - i - 1, len(generating))
            slot.next_token = None
            for guess in slot.guesses:
                batch.add(guess, slot.n_past, slot.seq_id, True)
                slot.n_past += 1
        wide = len(batch)  # tokens of generating slots; the step is timed if nothing else joins
        for slot in active:
            room = batch.capacity - len(batch)
            if not slot.prefilling or room == 0:
                continue
            assert slot.request is not None
            tokens = slot.request.tokens
            end = min(slot.n_past + room, len(tokens))
            for pos in range(slot.n_past, end):
                index = batch.add(tokens[pos], pos, slot.seq_id, pos == len(tokens) - 1)
            self.prefilled_tokens += end - slot.n_past
            slot.n_past = end
            if end == len(tokens):
                slot.logits_index = index
        t0 = time.perf_counter()
        self.context.decode(batch)
        now = time.perf_counter()
        if wide and len(batch) == wide:
            self.costs.observe(wide, now - t0)
        for slot in active:
            if slot.logits_index is not None and not slot.generated:
                slot.t_prefilled = now

    def _guesses(self, slot: _Slot, after: int, generating: int) -> list[int]:
        """What the slot guesses after its next token (just added to the batch): never past its
        token limit, and leaving room in the batch for the `after` slots still to add theirs."""
        spec = slot.spec
        if spec is None:
            return []
        assert slot.next_token is not None
        spec.extend((slot.next_token,))
        room = min(slot.limit - len(slot.generated), self.batch.capacity - len(self.batch) - after)
        base = len(self.batch) + after  # the step's tokens without this slot's guesses

        def cost_of(k: int) -> float:
            return self.costs.ratio(base, base + k)

        return spec.propose(room, cost_of, share=1.0 / generating)

    def _sample(self, slot: _Slot, on_logits: Callable[[Any, int, Any], None] | None) -> Outcome | None:
        """Sample the slot's next token (and check its guesses); its Outcome when the request is done."""
        request = slot.request
        assert request is not None and slot.logits_index is not None
        base = slot.logits_index

        def seen(index: int) -> None:
            if on_logits is not None:
                on_logits(request.key, len(slot.generated), self.context.logits(index))

        guesses, slot.guesses = slot.guesses, []
        endings: list[str] = []

        def take(token: int) -> bool:
            ended = self._emit(slot, token)
            if ended is not None:
                endings.append(ended)
            return ended is not None

        right, after = verify(slot.chain, self.context, base, guesses, take, seen)
        if not slot.generated and not endings:
            slot.t_first = time.perf_counter()
        if slot.spec is not None and slot.generated:  # (not the prefill's token: nothing was proposed)
            slot.spec.verified(len(guesses), right, right + 1)
            slot.spec.extend(guesses[:right])
        if guesses:
            slot.drafted += len(guesses)
            slot.accepted += right
            # The cache keeps the pending token and the right guesses: `after` follows them.
            slot.n_past -= len(guesses) - right
            self.context.memory_seq_rm(slot.seq_id, slot.n_past, -1)
        finish = endings[-1] if after is None else self._emit(slot, after)
        if finish is None:
            slot.next_token = after
            return None
        return self._finish(slot, finish)

    def _emit(self, slot: _Slot, token: int) -> str | None:
        """Take one sampled token; why the request ends if it does."""
        return take_token(self.model, slot.params, slot.stream, slot.generated, slot.limit, token)[1]

    def _finish(self, slot: _Slot, finish: str) -> Outcome:
        request = slot.request
        assert request is not None
        slot.stream.finish()
        t_end = time.perf_counter()
        timings = Timings(prefill_ms=(slot.t_prefilled - slot.t_start) * 1000,
                          decode_ms=(t_end - slot.t_prefilled) * 1000,
                          ttft_ms=(slot.t_first - slot.t_start) * 1000,
                          prefill_tokens=len(request.tokens) - slot.cached)
        usage = Usage(len(request.tokens), slot.cached, len(slot.generated), slot.drafted, slot.accepted)
        completion = Completion(slot.stream.text, finish, usage, timings, slot.params.seed,
                                slot.stream.stopped_by if finish == "stop" else None, slot.generated)
        slot.chain.close()
        slot.request = None
        self.context.memory_seq_rm(slot.seq_id, 0, -1)
        return Outcome(request.key, completion)
