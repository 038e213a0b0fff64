"""Continuous batching: each request gets what it would get alone, and shared work is done once."""

from __future__ import annotations

import numpy as np
import pytest

from infer.runtime.evaluate import all_logits
from infer.runtime.llama import Context, Model
from infer.runtime.params import ContextParams
from infer.runtime.request import Request
from infer.runtime.sampling import SamplingParams
from infer.runtime.scheduler import Scheduler
from infer.runtime.session import Completion, Session

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Once upon a time, in a kingdom far beyond the mountains and the sea, there lived",
    "1, 2, 3, 4, 5,",
    "Les feuilles mortes se ramassent à la pelle, les souvenirs et les regrets aussi.",
    "SELECT name, COUNT(*) FROM orders GROUP BY",
    "Roses are red,",
    "In 1969 the first humans walked on",
]


def tokens_of(model, text):
    return model.tokenize(text, add_special=True, parse_special=False)


def run_batched(path, requests, *, parallel, n_ctx=4096, shared_prefix=(), record=False, unified=None):
    """{key: Completion} (and {key: [logits per step]}) from a scheduler over `requests`."""
    logits: dict = {}
    cparams = ContextParams(n_ctx=n_ctx, n_seq_max=parallel + 1, kv_unified=unified)
    with Model(path) as model, Context(model, cparams) as ctx:
        scheduler = Scheduler(model, ctx, parallel=parallel, shared_prefix=shared_prefix)
        hook = (lambda key, step, row: logits.setdefault(key, []).append(row)) if record else None
        outcomes = list(scheduler.run(requests(model), on_logits=hook))
        prefilled = scheduler.prefilled_tokens
        scheduler.close()
    assert all(o.error is None for o in outcomes), [o.error for o in outcomes]
    return {o.key: o.completion for o in outcomes}, logits, prefilled


def solo(path, tokens, params):
    return solos(path, [tokens], params)[0]


def solos(path, prompts, params):
    """Each prompt's Completion alone: one session, its cache emptied before each."""
    with Session.open(path) as s:
        out = []
        for tokens in prompts:
            s.context.memory_clear()
            s.tokens.clear()
            out.append(next(e for e in s.generate(tokens, params) if isinstance(e, Completion)))
        return out


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0, max_tokens=12),
                                    SamplingParams(temperature=0.9, seed=42, max_tokens=12)],
                         ids=["greedy", "seeded"])
def test_one_at_a_time_equals_a_solo_run(tiny_llama, params):
    def requests(model):
        return [Request(i, tokens_of(model, p), params) for i, p in enumerate(PROMPTS[:4])]

    got, _, _ = run_batched(tiny_llama, requests, parallel=1)
    with Model(tiny_llama, vocab_only=True) as model:
        prompts = [tokens_of(model, p) for p in PROMPTS[:4]]
    assert [got[i].text for i in range(4)] == [c.text for c in solos(tiny_llama, prompts, params)]


@pytest.mark.parametrize("unified", [True, False], ids=["unified-kv", "kv-per-sequence"])
@pytest.mark.parametrize("parallel", [4, 16])
def test_batched_logits_match_each_sequence_decoded_alone(tiny_llama, parallel, unified):
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    n = 16 if parallel == 16 else 8

    def requests(model):
        return [Request(i, tokens_of(model, PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS))), params)
                for i in range(n)]

    got, logits, _ = run_batched(tiny_llama, requests, parallel=parallel, record=True, unified=unified)
    with Session.open(tiny_llama) as alone:
        for key, steps in logits.items():
            prompt = requests(alone.model)[key].tokens
            # The same sequence alone, fed the tokens the batched run chose.
            reference = all_logits(alone, prompt + got[key].tokens)[len(prompt) - 1:]
            assert len(steps) == len(got[key].tokens) == 10
            for step, row in enumerate(steps):
                err = np.max(np.abs(row - reference[step])) / np.max(np.abs(reference[step]))
                assert err <= 1e-3, (key, step, err)


def test_more_requests_than_slots_all_finish_and_a_bad_one_fails_alone(tiny_llama):
    params = SamplingParams(temperature=0.0, max_tokens=6)
    with Model(tiny_llama) as model, Context(model, ContextParams(n_ctx=512, n_seq_max=4)) as ctx:
        scheduler = Scheduler(model, ctx, parallel=3)
        requests = [Request(i, tokens_of(model, PROMPTS[i % 8]), params) for i in range(10)]
        requests.insert(5, Request("long", tokens_of(model, "word " * 400), params))
        requests.insert(7, Request("empty", [], params))
        outcomes = list(scheduler.run(requests))
        scheduler.close()
    done = {o.key: o for o in outcomes}
    assert set(done) == {*range(10), "long", "empty"}
    assert "parallel slots" in done["long"].error and done["empty"].error
    assert all(done[i].completion.usage.completion_tokens == 6 for i in range(10))


@pytest.mark.parametrize("unified", [True, False], ids=["unified-kv", "kv-per-sequence"])
def test_a_shared_prefix_is_prefilled_once_and_copied(tiny_llama, unified):
    params = SamplingParams(temperature=0.0, max_tokens=8)
    system = "You are a helpful assistant who answers in one short sentence. " * 4
    questions = ["What is rain?", "Why is snow white?", "Where do rivers go?", "How old is the sun?",
                 "What is a cloud?", "Why is the sea salty?"]
    lengths = {}

    def requests(model):
        prefix = tokens_of(model, system)
        out = []
        for i, q in enumerate(questions):
            tokens = prefix + model.tokenize(q, add_special=False, parse_special=False)
            lengths[i] = len(tokens)
            out.append(Request(i, tokens, params))
        return out

    with Model(tiny_llama, vocab_only=True) as vocab:
        prefix = tokens_of(vocab, system)
        prompts = [prefix + vocab.tokenize(q, add_special=False, parse_special=False) for q in questions]
    got, _, prefilled = run_batched(tiny_llama, requests, parallel=4, shared_prefix=prefix, unified=unified)
    assert prefilled == len(prefix) + sum(n - len(prefix) for n in lengths.values())
    assert all(c.usage.cached_tokens == len(prefix) for c in got.values())
    alone = solos(tiny_llama, prompts, params)
    assert {i: c.text for i, c in got.items()} == {i: c.text for i, c in enumerate(alone)}  # each its own


def _serve_once(path, tokens, params, *, cache, checkpoint=0, parallel=2):
    """One request through a fresh context and scheduler that keeps its cells (a server that
    has just started): its Completion and the logits it sampled from."""
    logits = []
    cparams = ContextParams(n_ctx=2048, n_seq_max=parallel, kv_unified=False)
    with Model(path) as model, Context(model, cparams) as ctx:
        scheduler = Scheduler(model, ctx, parallel=parallel, keep_cache=True, prompt_cache=cache,
                              cache_name="tiny")
        scheduler.on_logits = lambda key, step, row: logits.append(row.copy())
        assert scheduler.add(Request(0, tokens, params, checkpoint=checkpoint)) is None
        outcomes = []
        while scheduler.running:
            outcomes += scheduler.step()
        scheduler.close()
    if cache is not None:
        cache.flush()
    assert outcomes[0].error is None
    return outcomes[0].completion, logits


def test_a_restarted_scheduler_loads_a_long_prefix_from_the_prompt_cache(tiny_llama, tmp_path):
    from infer.runtime.prompt_cache import PromptCache

    cache = PromptCache(tmp_path / "prompts")
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    with Model(tiny_llama, vocab_only=True) as vocab:
        document = tokens_of(vocab, "The quick brown fox jumps over the lazy dog. " * 40)
        first = document + vocab.tokenize(" Who jumps?", add_special=False, parse_special=False)
        second = document + vocab.tokenize(" Who is lazy, and why?", add_special=False, parse_special=False)
    assert len(document) > cache.min_tokens

    done, _ = _serve_once(tiny_llama, first, params, cache=cache, checkpoint=len(document))
    assert done.usage.cached_tokens == 0
    assert [e.n_tokens for e in cache.entries()] == [len(document)]  # saved where the question begins

    done, logits = _serve_once(tiny_llama, second, params, cache=cache, checkpoint=len(document))
    assert done.usage.cached_tokens == len(document)  # loaded, not computed again
    assert len(cache.entries()) == 1  # nothing new to save
    fresh, reference = _serve_once(tiny_llama, second, params, cache=None)
    assert done.tokens == fresh.tokens
    for row, expected in zip(logits, reference, strict=True):
        np.testing.assert_allclose(row, expected, atol=1e-3)


def test_states_of_another_kv_layout_are_left_alone(tiny_llama, tmp_path):
    """`infer run` saves states of a single-stream context; a server's context with a stream per
    slot cannot load them (llama.cpp refuses), so it must not try, nor remove them."""
    from infer.runtime.prompt_cache import PromptCache

    cache = PromptCache(tmp_path / "prompts")
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    with Model(tiny_llama, vocab_only=True) as vocab:
        tokens = tokens_of(vocab, "Pack my box with five dozen liquor jugs. " * 40)
    with Session.open(tiny_llama, ContextParams(n_ctx=2048)) as session:
        list(session.generate(tokens, params))
        cache.store(session, "tiny")
    assert len(cache.entries()) == 1
    done, _ = _serve_once(tiny_llama, tokens + tokens[1:3], params, cache=cache)
    assert done.usage.cached_tokens == 0
    assert len(cache.entries()) == 1
