"""Helpers for tests on the embedded real model: where two token sequences part, and why."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from infer.runtime.sampling import SamplingParams
from infer.runtime.session import Session, common_prefix_len

NEAR_TIE = 1e-3  # top-2 logits this close (relative) may swap under batch-shape rounding
# The longest verification batch replayed: --spec-draft-n-max's default. (Each tail j also
# decodes the token before it alone, as a step between two batches does: on an AMD EPYC a
# single token rounds otherwise than a batch, and batches of 2 and of 61 tokens alike.)
MAX_BATCH_TAIL = 16


@dataclass
class Divergence:
    """The first position where two greedy continuations differ, and the logits there."""

    index: int
    ours: int | None  # None: this side ended there (an end-of-generation token)
    theirs: int | None
    top2: tuple[int, int]
    gap: float  # |l1 - l2| / max(|l1|, |l2|) of the two highest logits
    explained: bool  # the two choices are the two highest logits (EOG for an ended side)

    @property
    def is_near_tie(self) -> bool:
        return self.explained and self.gap <= NEAR_TIE


def first_divergence(session: Session, prompt: Sequence[int], ours: Sequence[int],
                     theirs: Sequence[int]) -> Divergence | None:
    """None if `ours` and `theirs` are the same; else where they part, with the logits `ours`
    was drawn from there (`session` replays its greedy decoding: prefill, then token by token).

    A sequence shorter than the other ended there with an end-of-generation token."""
    i = common_prefix_len(ours, theirs)
    if i == len(ours) == len(theirs):
        return None
    a = ours[i] if i < len(ours) else None
    b = theirs[i] if i < len(theirs) else None
    # The logits `ours` was sampled from there: the prompt prefilled, then one token at a time.
    session.context.memory_clear()
    session.tokens.clear()
    session.prefill(prompt)
    for token in ours[:i]:
        session.decode_token(token)
    logits = session.context.logits(-1)
    order = np.argsort(logits)[::-1]
    top2 = (int(order[0]), int(order[1]))
    l1, l2 = float(logits[top2[0]]), float(logits[top2[1]])
    gap = abs(l1 - l2) / max(abs(l1), abs(l2), 1e-9)
    picks = [t if t is not None else next((u for u in top2 if session.model.is_eog(u)), -1)
             for t in (a, b)]
    return Divergence(i, a, b, top2, gap, explained=set(picks) == set(top2))


def assert_same_or_near_tie(session: Session, prompt: Sequence[int], ours: Sequence[int],
                            theirs: Sequence[int], what: str) -> bool:
    """Assert the sequences agree, or part at a near-tie; True if they agreed."""
    d = first_divergence(session, prompt, ours, theirs)
    if d is None:
        return True

    def show(t: int | None) -> str:
        return "end of generation" if t is None else f"{t} {session.model.token_bytes(t)!r}"

    assert d.is_near_tie, (
        f"{what}: token {d.index} differs ({show(d.ours)} vs {show(d.theirs)}); the top two "
        f"logits there are tokens {d.top2}, {d.gap:.2e} apart (relative): not a near-tie")
    return False


def assert_same_or_rounding(session: Session, prompt: Sequence[int], ours: Sequence[int],
                            theirs: Sequence[int], params: SamplingParams, what: str,
                            layout_noise: float = 0.0) -> bool:
    """Assert that `theirs` (decoded with batches of several tokens: verification steps, or
    steps shared with other sequences) equals `ours` (decoded one token at a time), or that
    where they part the difference is the rounding of batch shapes. True if they agreed or
    parted where one of the batch shapes below draws `theirs`' token (the difference
    reproduced); False where only the bound on the rounding explains it.

    llama.cpp computes a batch of several tokens with other kernels than a single token: on
    this Q4_1 model the logits of a single-token step differ from those of any batch of two
    or more by up to a few percent (0.52 of a logit of 22 on an AMD EPYC; batches of 2 and
    of 61 tokens agree exactly), so a near-tie here is wider than NEAR_TIE. At the first
    difference the request's sampler chain is replayed on `ours` (token by token, which must
    give `ours` back), and copies of it sample from the same position computed in the batch
    shapes a batched run uses there: the whole prefix as one batch, and the prefix then a
    batch of its last j tokens (j = 1..MAX_BATCH_TAIL, a verification step). The difference
    is explained if one of them draws `theirs`' token, or if the two tokens' logits are
    closer than twice the largest difference between the logits of one step and of those
    shapes, or than a near-tie (a unified KV cache's layout, which is not replayed), or than
    twice `layout_noise`: how far that layout was measured to move the logits (`pool_noise`).
    """
    from infer.runtime.sampling import build_sampler_chain

    i = common_prefix_len(ours, theirs)
    if i == len(ours) == len(theirs):
        return True
    a = ours[i] if i < len(ours) else None
    b = theirs[i] if i < len(theirs) else None

    def show(t: int | None) -> str:
        return "end of generation" if t is None else f"{t} {session.model.token_bytes(t)!r}"

    def drew_theirs(token: int) -> bool:
        return token == b if b is not None else session.model.is_eog(token)

    prefix = [*prompt, *ours[:i]]
    with build_sampler_chain(params, session.model) as chain:
        session.context.memory_clear()
        session.tokens.clear()
        session.prefill(prompt)
        for token in ours[:i]:
            assert chain.sample(session.context) == token, f"{what}: the replay is not the run"
            session.decode_token(token)
        single = session.context.logits(-1)
        with chain.clone() as before:
            drawn = chain.sample(session.context)
            assert (drawn == a if a is not None else session.model.is_eog(drawn)), (
                f"{what}: the replay is not the run")
            shapes = []
            session.context.memory_clear()
            session.tokens.clear()
            session.prefill(prefix)  # the whole prefix as one batch
            shapes.append(session.context.logits(-1))
            with before.clone() as twin:
                if drew_theirs(twin.sample(session.context)):
                    return True
            for j in range(1, min(MAX_BATCH_TAIL, i) + 1):
                session.prefill(prefix[:-j])  # (which decodes the token before the tail alone)
                session.prefill(prefix)  # the tail as one batch
                shapes.append(session.context.logits(-1))
                with before.clone() as twin:
                    if drew_theirs(twin.sample(session.context)):
                        return True
    eog = max(session.model.eog_tokens(), key=lambda t: float(single[t]))  # an ended side's
    picks = [t if t is not None else eog for t in (a, b)]
    noise = max(float(np.abs(single - other).max()) for other in shapes)
    gap = abs(float(single[picks[0]]) - float(single[picks[1]]))
    # Two logits each moved by at most `noise` can swap if they are within twice that. A
    # sequence in a unified KV cache (a server's pool) attends to its cells among other
    # sequences' (masked), which orders the attention's sums otherwise than alone: that
    # layout is not replayed here, and a near-tie (NEAR_TIE of the top logit) stands for it.
    floor = max(NEAR_TIE * float(np.abs(single).max()), 2 * layout_noise)
    assert gap <= max(2 * noise, floor), (
        f"{what}: token {i} differs ({show(a)} vs {show(b)}), {gap:.3f} apart in the logits, "
        f"while batch shapes and single steps differ by {noise:.3f} there: not explained by rounding")
    return False


def pool_noise(path: Path, prompts: Sequence[Sequence[int]], **settings: Any) -> float:
    """How far the last logits of `prompts` prefilled together in one batch of a unified KV
    cache (a server's pool, its sequences' cells side by side) are from each one's prefilled
    alone: the rounding of that layout, which `assert_same_or_rounding` does not replay."""
    from infer.runtime.llama import Batch, Context, Model
    from infer.runtime.params import ContextParams

    cparams = ContextParams(n_ctx=2048, n_seq_max=len(prompts), kv_unified=True, **settings)
    with Model(path) as model, Context(model, cparams) as ctx:
        batch = Batch(sum(len(p) for p in prompts), len(prompts))
        last = [0] * len(prompts)
        for seq, prompt in enumerate(prompts):
            for pos, token in enumerate(prompt):
                last[seq] = batch.add(token, pos, seq, pos == len(prompt) - 1)
        ctx.decode(batch)
        together = [ctx.logits(i) for i in last]
        worst = 0.0
        for seq, prompt in enumerate(prompts):
            ctx.memory_clear()
            batch.set_tokens(prompt, start_pos=0)
            ctx.decode(batch)
            worst = max(worst, float(np.abs(ctx.logits(len(prompt) - 1) - together[seq]).max()))
        batch.close()
    return worst
