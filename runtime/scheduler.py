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

Two ways to drive it: ``run(requests)`` for a list known in advance (``infer batch``),
or ``add`` and ``step`` for requests that arrive while others run (``runtime.engine``,
behind ``infer serve``). With ``keep_cache`` a finished slot keeps its KV cells, and a
new request goes to the slot holding the longest common prefix of its tokens, or has
that prefix copied from another slot (a conversation sent again with one more
message prefills only that message; the ``n`` choices of a request prefill once).
With a ``prompt_cache`` as well, a request that finds no such prefix in memory loads
the longest one saved on disk (a server that restarted), and a request's prefill
saves the state of its ``checkpoint`` prefix there (where its last message begins)
when it computed at least the cache's threshold of those tokens itself.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from infer.runtime.errors import InferError
from infer.runtime.generation import Generation
from infer.runtime.llama import Batch, Context, Model
from infer.runtime.media import run_start
from infer.runtime.preemption import Room
from infer.runtime.prompt_cache import PromptCache
from infer.runtime.request import Delta, Outcome, Request
from infer.runtime.session import common_prefix_len, state_fingerprint
from infer.runtime.slot import PREFIX_SEQ, Slot, SlotState, place, waits_for_prefill
from infer.runtime.speculative import CostModel, SpecParams, Speculator


class Scheduler:
    """Runs requests `parallel` at a time in `context` (which needs n_seq_max >= parallel + 1).

    With a unified KV cache the cells are one pool (runtime/preemption.py): a request may
    use all of them beyond the shared prefix, up to the model's training context; it starts
    when the cells of its prompt are free, and the latest one is suspended when the running
    ones need more than there are. Without, each slot has its sequence's stream less the
    prefix. A request whose prompt and token limit cannot fit fails on its own.
    """

    def __init__(self, model: Model, context: Context, *, parallel: int,
                 shared_prefix: Sequence[int] = (), speculation: SpecParams | None = None,
                 keep_cache: bool = False, prompt_cache: PromptCache | None = None,
                 cache_name: str = "") -> None:
        if parallel < 1:
            raise ValueError("parallel must be at least 1")
        if speculation is not None and speculation.type == "draft":
            raise ValueError("the scheduler speculates with prompt lookup only")
        if keep_cache and shared_prefix:
            raise ValueError("keep_cache finds shared prefixes itself")
        if prompt_cache is not None and not keep_cache:
            raise ValueError("the prompt cache loads states into slots that keep their cells (keep_cache)")
        self.model, self.context = model, context
        self.keep_cache = keep_cache
        self.prompt_cache, self.cache_name = prompt_cache, cache_name
        self.batch = Batch(context.n_batch)
        self.costs = CostModel(self.batch.capacity)  # steps of generating slots only
        first = 1 if shared_prefix else 0  # sequence 0 holds the shared prefix
        self.slots = [Slot(seq_id, Speculator(speculation) if speculation and speculation.enabled else None)
                      for seq_id in range(first, parallel + first)]
        for slot in self.slots:  # one acceptance for all: the requests of a batch are usually alike
            if slot.spec is not None and self.slots[0].spec is not None:
                slot.spec.acceptance = self.slots[0].spec.acceptance
        self.prefix = list(shared_prefix)
        self._spare = 0  # cells a step has left for guesses and prefill
        self.room = Room(context, self.slots)  # every change to the sequences' cells goes through it
        self.pooled = context.kv_unified  # (the prefix's cells are shared by the slots' copies)
        if self.pooled:
            self.slot_cells = min(context.n_ctx, model.n_ctx_train or context.n_ctx) - len(self.prefix)
        else:  # each sequence's stream holds its own copy of the prefix
            self.slot_cells = context.n_ctx_seq - len(self.prefix)
        self.prefilled_tokens = 0  # every prompt token decoded, the shared prefix included
        # `on_logits(key, step, logits)` sees every logits vector a request samples from
        # (step 0 is the first generated token): for tests.
        self.on_logits: Callable[[Any, int, Any], None] | None = None
        self.room.clear()
        if self.prefix:
            self._prefill_prefix()

    def close(self) -> None:
        self.abort()
        self.batch.close()

    @property
    def free_slots(self) -> int:
        return sum(slot.request is None for slot in self.slots)

    @property
    def running(self) -> int:
        """Requests in slots, suspended ones included."""
        return len(self.slots) - self.free_slots

    @property
    def cells_used(self) -> int:
        """KV cells holding tokens: the running requests', the kept caches' and the prefix's
        (a cell that sequences share counts once)."""
        return self.room.pool.used

    def run(self, requests: Iterable[Request],
            on_logits: Callable[[Any, int, Any], None] | None = None) -> Iterator[Outcome]:
        """Yield each request's outcome as soon as it is done (not in input order)."""
        self.on_logits = on_logits
        waiting = iter(requests)
        exhausted = False
        held: Request | None = None  # the next request, waiting for cells
        try:
            while True:
                while self.free_slots and not exhausted:
                    request = held or next(waiting, None)
                    held = None
                    if request is None:
                        exhausted = True
                    elif not self.admits(request.tokens):
                        held = request
                        break
                    else:
                        error = self.add(request)
                        if error is not None:
                            yield error
                if not self.running:
                    return
                yield from self.step()
        finally:  # also when the caller stops early (Ctrl-C): free what the running requests hold
            self.abort()

    def abort(self) -> None:
        """Drop the running requests (their outcomes are not reported)."""
        for slot in self.slots:
            if slot.request is not None:
                slot.gen.close()
                slot.request, slot.saved = None, None
                slot.cache = []
                self.room.rm(slot.seq_id)

    def waits_for_prefill(self, tokens: Sequence[int]) -> bool:
        """Whether a request for `tokens` had better wait (slot.waits_for_prefill)."""
        return self.keep_cache and waits_for_prefill(self.slots, tokens)

    def admits(self, tokens: Sequence[int]) -> bool:
        """Whether a request for `tokens` may start now (in a pool: the cells of its uncached
        prompt are free, or may be freed by evicting idle caches)."""
        if not self.pooled:
            return True
        shared = self._place(tokens)[2]
        return self.room.admits(len(tokens) - min(shared, len(tokens) - 1))

    def step(self) -> list[Outcome]:
        """One decode for every running request: the outcomes of those that ended (cancelled
        ones included, with finish reason "cancelled")."""
        ended = [self._finish(s, "cancelled") for s in self.slots
                 if s.request is not None and s.request.cancelled]
        if self.pooled:
            self.room.make_room()
        active = [s for s in self.slots if s.request is not None and not s.suspended]
        if not active:
            return ended
        self._step(active)
        for slot in active:
            if slot.logits_index is not None:
                done = self._sample(slot)
                if done is not None:
                    ended.append(done)
        return ended

    def _prefill_prefix(self) -> None:
        n_batch = self.batch.capacity
        for start in range(0, len(self.prefix), n_batch):
            self.batch.clear()
            for i, token in enumerate(self.prefix[start:start + n_batch]):
                self.batch.add(token, start + i, PREFIX_SEQ, False)
            self.context.decode(self.batch)
            self.room.pool.grow(PREFIX_SEQ, len(self.batch))
        self.prefilled_tokens += len(self.prefix)

    def fit_error(self, n_tokens: int, max_tokens: int | None) -> str | None:
        """Why a prompt of `n_tokens` (beyond the shared prefix) with this token limit cannot
        run here; None if it can."""
        room = self.slot_cells - n_tokens
        if room >= 1 and (max_tokens is None or max_tokens <= room):
            return None
        needs = f"the prompt needs {n_tokens + (max_tokens or 1)} tokens of context with its token limit"
        if self.pooled:
            whole = self.slot_cells + len(self.prefix)
            what = "context" if whole == self.context.n_ctx else "model's training context"
            shared = ", less the prefix all requests share" if self.prefix else ""
            return f"{needs} but a request may use {self.slot_cells} (the {what} of {whole} tokens{shared})"
        return (f"{needs} but each of the {len(self.slots)} parallel slots has {self.slot_cells} "
                "(raise -c or lower --parallel)")

    def add(self, request: Request) -> Outcome | None:
        """Start `request` in a free slot (there must be one); an Outcome with an error if it
        cannot run."""
        tokens = request.tokens
        if not tokens:
            return Outcome(request.key, error="the prompt is empty", request=request)
        if tokens[-1] < 0:
            return Outcome(request.key, error="the prompt ends with a medium: some text must follow it",
                           request=request)
        own = len(tokens) - min(common_prefix_len(tokens, self.prefix), len(tokens) - 1)
        max_tokens = request.params.max_tokens
        error = self.fit_error(own, max_tokens)
        if error is not None:
            return Outcome(request.key, error=error, request=request)
        room = self.slot_cells - own
        slot, donor, shared = self._place(tokens)
        if self.prompt_cache is not None and shared < self.prompt_cache.min_tokens < len(tokens):
            slot, donor, shared = self._restore(tokens, slot, donor, shared)
        shared = min(shared, len(tokens) - 1)  # the last prompt token is decoded in the slot, for its logits
        shared = run_start(tokens, shared)  # (a medium is evaluated whole)
        limit = room if max_tokens is None else max_tokens
        try:
            gen = Generation(self.model, request.params.with_seed(), limit, slot.spec,
                             thinking=request.thinking)
        except InferError as e:
            return Outcome(request.key, error=str(e), request=request)
        if donor is None:  # its own cells: keep the shared part, drop the rest
            self.room.rm(slot.seq_id, shared)
        else:
            self.room.rm(slot.seq_id)
            self.room.cp(donor, slot.seq_id, shared)
            self.room.rm(slot.seq_id, shared)  # (across streams the whole sequence was copied)
        slot.cache = []
        slot.start(request, gen, shared, self.room.admission())
        return None

    def load_state(self, seq: int, data: bytes, n: int) -> bool:
        """Sequence `seq` holds a saved state of `n` positions (the prompt cache's)."""
        return self.room.load(seq, data, n)

    def _place(self, tokens: Sequence[int]) -> tuple[Slot, int | None, int]:
        return place(self.slots, tokens, self.prefix, keep_cache=self.keep_cache)

    def _restore(self, tokens: Sequence[int], slot: Slot, donor: int | None,
                 shared: int) -> tuple[Slot, int | None, int]:
        """`_place`'s answer, or the least recently used free slot loaded with the longest
        prefix of `tokens` the prompt cache holds on disk if that is longer."""
        assert self.prompt_cache is not None
        target = min((s for s in self.slots if s.request is None), key=lambda s: s.used)
        before = target.cache
        held = self.prompt_cache.restore(SlotState(self, target), tokens, max_tokens=self.slot_cells)
        if held > shared:
            return target, None, held
        if target.cache is not before:  # a state llama.cpp refused emptied the slot: place again
            return self._place(tokens)
        return slot, donor, shared

    @functools.cached_property
    def fingerprint(self) -> dict[str, object]:
        """What the slots' saved states depend on (`session.state_fingerprint`)."""
        return state_fingerprint(self.model, self.context)

    def _step(self, active: list[Slot]) -> None:
        """One decode: the next token of each generating slot (and its guesses), then prefill
        chunks as room allows (a medium first, on its own: Slot.prefill_media)."""
        for slot in active:
            self.prefilled_tokens += slot.prefill_media(self.context, self.room, self.pooled)
        batch = self.batch
        batch.clear()
        generating = [slot for slot in active if slot.generating]
        # (in a pool: the cells left for guesses and prefill once each generating slot has its own)
        self._spare = self.room.pool.free - sum(1 + len(s.forced) for s in generating) if self.pooled \
            else batch.capacity
        for slot in active:
            slot.logits_index = None
        for i, slot in enumerate(generating):
            assert slot.next_token is not None
            forced, slot.forced = slot.forced, []  # a closing marker the slot writes itself
            written = [slot.next_token, *forced]
            for j, token in enumerate(written):
                slot.logits_index = batch.add(token, slot.n_past, slot.seq_id, j == len(written) - 1)
                slot.n_past += 1
            slot.guesses = [] if forced else self._guesses(slot, len(generating) - i - 1, len(generating))
            slot.next_token = None
            self._spare -= len(slot.guesses)
            for guess in slot.guesses:
                batch.add(guess, slot.n_past, slot.seq_id, True)
                slot.n_past += 1
        wide = len(batch)  # tokens of generating slots; the step is timed if nothing else joins
        saving = []
        for slot in active:
            room = min(batch.capacity - len(batch), self._spare)
            if not slot.prefilling or room <= 0:
                continue
            checkpoint = 0 if slot.next_token is not None else self._checkpoint(slot)
            added = slot.add_prefill(batch, room, checkpoint)
            self.prefilled_tokens += added
            self._spare -= added
            if checkpoint and slot.n_past == checkpoint:
                saving.append(slot)
        t0 = time.perf_counter()
        self.context.decode(batch)
        now = time.perf_counter()
        for slot in active:
            self.room.grew(slot)
        for slot in saving:  # (the state is copied now and written by a thread of the cache's)
            assert self.prompt_cache is not None
            self.prompt_cache.store(SlotState(self, slot), self.cache_name, wait=False)
        if wide and len(batch) == wide:
            self.costs.observe(wide, now - t0)
        for slot in active:
            if slot.logits_index is not None and not slot.gen.generated:
                slot.t_prefilled = now

    def _checkpoint(self, slot: Slot) -> int:
        """Where the prompt cache saves the slot's state: its request's checkpoint if it
        computed at least the cache's threshold of those tokens itself (0: nowhere)."""
        assert slot.request is not None
        checkpoint = min(slot.request.checkpoint, len(slot.request.tokens))
        if self.prompt_cache is None or checkpoint - slot.cached < self.prompt_cache.min_tokens:
            return 0
        return checkpoint

    def _guesses(self, slot: Slot, after: int, generating: int) -> list[int]:
        """What the slot guesses after its next token (just added to the batch): never past its
        token limit, and leaving room in the batch for the `after` slots still to add theirs."""
        gen = slot.gen
        if gen.spec is None or (slot.request is not None and slot.request.media is not None):
            return []  # (a prompt's media are no tokens a guess could repeat)
        assert slot.next_token is not None
        room = min(gen.limit - len(gen.generated), self.batch.capacity - len(self.batch) - after, self._spare)
        base = len(self.batch) + after  # the step's tokens without this slot's guesses

        def cost_of(k: int) -> float:
            return self.costs.ratio(base, base + k)

        return gen.propose(slot.next_token, room, cost_of, share=1.0 / generating)

    def _sample(self, slot: Slot) -> Outcome | None:
        """Sample the slot's next token (and check its guesses); its Outcome when the request is done."""
        request, gen = slot.request, slot.gen
        assert request is not None and slot.logits_index is not None
        base = slot.logits_index
        on_logits = self.on_logits

        def seen(index: int) -> None:
            if on_logits is not None:
                on_logits(request.key, len(gen.generated), self.context.logits(index))

        guesses, slot.guesses = slot.guesses, []
        taken_before = len(gen.generated)
        first = not gen.generated
        step = gen.step(self.context, base, guesses, seen)
        if first:
            slot.t_first = time.perf_counter()
        if step.rejected:  # the cache keeps the pending token and the right guesses
            slot.n_past -= step.rejected
            self.room.rm(slot.seq_id, slot.n_past)
        slot.tell(self.context, base, taken_before, step.text)
        finish = step.finish
        if finish is None and gen.thinking_due():
            assert step.next_token is not None
            finish = slot.close_thinking(step.next_token)
        elif finish is None:
            slot.next_token = step.next_token
        return None if finish is None else self._finish(slot, finish)

    def _finish(self, slot: Slot, finish: str) -> Outcome:
        request, gen = slot.request, slot.gen
        assert request is not None
        rest = gen.stream.finish()
        if rest and request.on_delta is not None:
            request.on_delta(Delta(rest, [], []))
        t_end = time.perf_counter()
        completion = gen.completion(finish, len(request.tokens), slot.cached, slot.timings(t_end))
        gen.close()
        if slot.suspended:  # (it holds no cells)
            slot.saved, slot.n_past = None, 0
        if self.keep_cache:  # what its cells hold stays for the next request with this prefix
            kept = min(slot.n_past, len(request.tokens) + len(gen.generated))
            slot.cache = (request.tokens + gen.generated)[:kept]
            self.room.rm(slot.seq_id, kept)
        else:
            self.room.rm(slot.seq_id)
        slot.request = None
        slot.used = t_end
        return Outcome(request.key, completion, request=request)
