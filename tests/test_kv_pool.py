"""The KV cache as one pool (issue 34): cells counted as llama.cpp's unified cache holds them,
requests admitted by the cells of their prompts, and requests that outgrow the pool suspended
and resumed with the text they would have written alone."""

from __future__ import annotations

import threading

import pytest
from real_model import assert_same_or_rounding
from test_real_model import LONG_TEXT
from test_scheduler import PROMPTS, solos, tokens_of

from infer.runtime.kv_pool import CellPool
from infer.runtime.llama import Context, Model
from infer.runtime.params import ContextParams
from infer.runtime.request import Request
from infer.runtime.sampling import SamplingParams
from infer.runtime.scheduler import Scheduler
from infer.runtime.session import Session


def test_cells_a_copy_shares_count_once_and_are_free_once_no_sequence_holds_them():
    pool = CellPool(100)
    pool.grow(1, 30)
    pool.copy(1, 2, 20)  # (llama_memory_seq_cp: the first 20 cells now belong to both)
    pool.grow(2, 5)
    assert (pool.used, pool.free, pool.own(1), pool.own(2), pool.held(2)) == (35, 65, 10, 5, 25)
    pool.cut(1)
    assert (pool.used, pool.own(2)) == (25, 25)  # what 2 shares stays
    pool.cut(2, 10)
    assert (pool.used, pool.held(2)) == (10, 10)
    pool.cut(2)
    assert pool.used == 0


def _run_pooled(path, requests, *, n_ctx: int, parallel: int, loads: bool = True):
    """{key: Outcome}, the preemptions and the resumptions that computed their cells again, of
    `requests` through a scheduler whose cells are one pool of `n_ctx`; `loads` False: no
    saved state loads back (as where llama.cpp finds no room for it in one piece)."""
    cparams = ContextParams(n_ctx=n_ctx, n_seq_max=parallel, kv_unified=True)
    with Model(path) as model, Context(model, cparams) as ctx:
        if not loads:
            ctx.set_seq_state = lambda data, seq_id=0: False
        scheduler = Scheduler(model, ctx, parallel=parallel)
        outcomes = list(scheduler.run(requests(model)))
        assert scheduler.cells_used == 0 and not scheduler.running
        counts = scheduler.room.preemptions, scheduler.room.recomputed
        scheduler.close()
    return {o.key: o for o in outcomes}, counts


@pytest.mark.parametrize("loads", [True, False], ids=["state-loaded", "recomputed"])
def test_requests_that_outgrow_the_pool_are_suspended_and_end_as_they_would_alone(tiny_llama, loads):
    """Three requests that each fit the pool of 512 cells, but not together: all are admitted
    (their prompts fit), the latest is suspended when the cells run out, and each ends with
    the text it writes alone (greedy), whether its state was loaded back or computed again."""
    params = SamplingParams(temperature=0.0, max_tokens=150, ignore_eos=True)

    def requests(model):
        return [Request(i, tokens_of(model, PROMPTS[i + 1] * 5), params) for i in range(3)]

    got, (preempted, recomputed) = _run_pooled(tiny_llama, requests, n_ctx=512, parallel=3, loads=loads)
    assert preempted >= 1 and (recomputed >= 1) == (not loads)
    with Model(tiny_llama, vocab_only=True) as model:
        sent = requests(model)
    alone = solos(tiny_llama, [r.tokens for r in sent], params)
    for request, own in zip(sent, alone, strict=True):
        outcome = got[request.key]
        assert outcome.error is None and outcome.completion.usage.completion_tokens == 150
        assert outcome.completion.text == own.text, request.key


def test_a_request_longer_than_a_share_runs_and_one_that_can_never_fit_fails_alone(tiny_llama):
    """With 4 slots in 1,024 cells, a prompt of 700 tokens runs beside short ones (a quarter
    share would refuse it); one whose prompt and token limit exceed the context fails with the
    numbers, and the others finish."""
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)

    def requests(model):
        long = tokens_of(model, "word " * 700)
        return [Request("long", long, params), Request("never", long + long, params),
                *(Request(i, tokens_of(model, PROMPTS[i]), params) for i in range(6))]

    got, _ = _run_pooled(tiny_llama, requests, n_ctx=1024, parallel=4)
    assert got["long"].error is None and got["long"].completion.usage.completion_tokens == 20
    assert "may use 1024 (the context of 1024 tokens)" in got["never"].error
    assert all(got[i].completion.usage.completion_tokens == 20 for i in range(6))


def test_the_engine_admits_by_cells_and_preempts_without_failing_anyone(tiny_llama):
    """The server's engine over a pool of 512 cells and 3 slots: six requests that together
    need far more, submitted at once, all end with their whole token limit and the text a
    scheduler run gives them; some were suspended on the way, none failed."""
    from infer.runtime.engine import Engine

    params = SamplingParams(temperature=0.0, max_tokens=120, ignore_eos=True)
    with Model(tiny_llama) as model:
        requests = [Request(i, tokens_of(model, PROMPTS[i % 4 + 1] * 4), params) for i in range(6)]
        engine = Engine(model, ContextParams(n_ctx=512, n_threads=2), parallel=3)
        done: dict = {}
        finished = threading.Event()

        def heard(outcome) -> None:
            done[outcome.key] = outcome
            if len(done) == len(requests):
                finished.set()

        for request in requests:
            engine.submit(request, heard)
        assert finished.wait(300)
        preempted = engine.preemptions
        engine.close()
    assert all(o.error is None and o.completion.usage.completion_tokens == 120 for o in done.values())
    assert preempted >= 1
    alone = solos(tiny_llama, [requests[0].tokens, requests[5].tokens], params)
    assert [done[0].completion.text, done[5].completion.text] == [c.text for c in alone]


def test_a_preempted_request_on_the_real_model_writes_what_it_writes_alone(smollm2):
    """The embedded model, two requests of 240 prompt tokens in a pool of 512 cells: both
    are admitted, the pool runs out while they generate, the later one is suspended and
    resumed, and its greedy reply equals its reply alone."""
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    texts = [LONG_TEXT * 2, "Tell me what happens next. " + LONG_TEXT[::-1] * 2]

    def requests(model):
        return [Request(i, tokens_of(model, text)[:240], params) for i, text in enumerate(texts)]

    got, (preempted, _) = _run_pooled(smollm2, requests, n_ctx=512, parallel=2)
    assert preempted >= 1
    with Session.open(smollm2, ContextParams(n_ctx=512)) as session:
        later = requests(session.model)[1]
        *_, alone = session.generate(later.tokens, params)
        assert_same_or_rounding(session, later.tokens, alone.tokens, got[1].completion.tokens, params,
                                "the suspended request")


def test_slots_that_share_a_prefix_hold_its_cells_once(tiny_llama):
    """Two requests with the same 300-token preamble, the second arriving while the first
    runs: the second's prefix is a copy of the first's cells (llama_memory_seq_cp in one
    pool), so the pool holds the preamble once, and the second computes only its own tail."""
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    cparams = ContextParams(n_ctx=2048, n_seq_max=2, kv_unified=True)
    with Model(tiny_llama) as model, Context(model, cparams) as ctx:
        preamble = tokens_of(model, "You are a careful assistant. " * 50)[:300]
        first = Request("a", preamble + tokens_of(model, "What is rain?")[1:], params)
        second = Request("b", preamble + tokens_of(model, "Why is snow white?")[1:], params)
        scheduler = Scheduler(model, ctx, parallel=2, keep_cache=True)
        assert scheduler.add(first) is None
        scheduler.step()  # (its prompt decoded)
        assert scheduler.add(second) is None
        scheduler.step()
        a, b = (next(s for s in scheduler.slots if s.request is r) for r in (first, second))
        assert b.cached >= 300
        assert scheduler.cells_used == a.n_past + b.n_past - b.cached  # the preamble once
        done = {o.key: o for o in scheduler.run([])}
        assert scheduler.cells_used > 0  # (what finished stays, for the next request)
        scheduler.close()
    assert all(o.completion.usage.completion_tokens == 8 for o in done.values())
    assert done["b"].completion.usage.cached_tokens >= 300
