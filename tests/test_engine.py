"""The engine behind `infer serve`: shutting down while requests run, finish and wait."""

from __future__ import annotations

import random
import threading
import time

import pytest

from infer.runtime.engine import Engine
from infer.runtime.llama import Model
from infer.runtime.params import ContextParams
from infer.runtime.request import Outcome, Request
from infer.runtime.sampling import SamplingParams

ROUNDS = 50


@pytest.fixture(scope="module")
def model(tiny_spm):
    with Model(tiny_spm) as m:
        yield m


def test_shutdown_returns_however_the_running_requests_end(model):
    """Shutdown while three requests run and end at different steps, some on their own within
    the grace period, some cut at its end, at a different moment each round: close() returns
    once they have ended, every request hears its outcome, and nothing is left running.
    (The engine used to block for ever on its empty inbox when the last request ended on its
    own after the shutdown's wake-up had been taken.)"""
    rng = random.Random(0)
    tokens = model.tokenize("Once upon a time", add_special=True, parse_special=False)
    for round_ in range(ROUNDS):
        engine = Engine(model, ContextParams(n_ctx=1024, n_threads=2), parallel=3)
        heard: list[Outcome] = []
        lengths = [4, 16, 64] if round_ % 2 else [8, 32, 400]  # the last one cut by a short grace
        for i, n in enumerate(lengths):
            engine.submit(Request(i, tokens, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)),
                          heard.append)
        time.sleep(rng.uniform(0, 0.03))
        grace = 30.0 if round_ % 2 else rng.uniform(0.01, 0.05)
        closer = threading.Thread(target=engine.close, args=(grace,), daemon=True)
        t0 = time.monotonic()
        closer.start()
        closer.join(20)
        assert not closer.is_alive(), f"round {round_}: close() still waits after 20 s"
        assert time.monotonic() - t0 < 10, round_
        assert sorted(o.key for o in heard) == [0, 1, 2], (round_, heard)
        assert engine.running == 0 and engine.waiting == 0
        for o in heard:  # ended on its own, or cut at the end of the grace period
            assert o.completion is not None or o.error in ("cancelled", "the server is shutting down"), o


def test_a_request_after_shutdown_is_refused(model):
    from infer.runtime.engine import Closed

    engine = Engine(model, ContextParams(n_ctx=512, n_threads=2), parallel=1)
    engine.shutdown()
    with pytest.raises(Closed):
        engine.submit(Request(0, [1, 2, 3], SamplingParams(max_tokens=1)), lambda o: None)
    closer = threading.Thread(target=engine.close, daemon=True)
    closer.start()
    closer.join(10)
    assert not closer.is_alive()


def test_a_request_is_counted_from_submit_to_outcome_even_while_it_is_being_admitted(model):
    """Between leaving the waiting line and taking its slot a request was in neither count:
    a stop then reported the server "idle" while it ran, and the model pool could unload a
    model it had just handed a request. Admission is slowed here to open that moment wide."""
    engine = Engine(model, ContextParams(n_ctx=512, n_threads=2), parallel=1)
    add = engine.scheduler.add

    def slow_add(request):
        time.sleep(0.3)
        return add(request)

    engine.scheduler.add = slow_add
    done = threading.Event()
    tokens = model.tokenize("Once upon a time", add_special=True, parse_special=False)
    engine.submit(Request(0, tokens, SamplingParams(temperature=0, max_tokens=4)), lambda o: done.set())
    seen = set()
    while not done.is_set():
        seen.add((engine.running, engine.waiting, engine.idle))
        time.sleep(0.002)
    engine.close()
    assert all(running + waiting == 1 and not idle for running, waiting, idle in seen), seen
    assert (1, 0, False) in seen and engine.idle


def test_a_request_that_fails_to_start_fails_alone_and_the_engine_goes_on(model):
    """An exception while a request takes its slot (a bug, or llama.cpp refusing) used to end
    the engine's thread: that request and every later one waited for ever."""
    engine = Engine(model, ContextParams(n_ctx=512, n_threads=2), parallel=1)
    add = engine.scheduler.add
    calls = []

    def failing_once(request):
        calls.append(request)
        if len(calls) == 1:
            raise TypeError("this function takes at least 5 arguments (4 given)")
        return add(request)

    engine.scheduler.add = failing_once
    tokens = model.tokenize("Once upon a time", add_special=True, parse_special=False)
    heard: list[Outcome] = []
    done = threading.Event()
    for i in range(2):
        engine.submit(Request(i, tokens, SamplingParams(temperature=0, max_tokens=4)),
                      lambda o: (heard.append(o), len(heard) == 2 and done.set()))
    assert done.wait(30), heard
    engine.close()
    assert "the model failed" in (heard[0].error or "") and heard[1].completion is not None, heard
