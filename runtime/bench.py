"""Prefill and decode throughput of the runtime, measured like llama.cpp's llama-bench."""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass

from infer.runtime.sampling import SamplingParams
from infer.runtime.session import Completion, Session


@dataclass(frozen=True)
class BenchResult:
    """One test (``pp512``: prefill 512 tokens; ``tg128``: generate 128) over repetitions."""

    test: str
    n_tokens: int
    tokens_per_second: tuple[float, ...]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.tokens_per_second)

    @property
    def stdev(self) -> float:
        return statistics.stdev(self.tokens_per_second) if len(self.tokens_per_second) > 1 else 0.0


def _random_tokens(session: Session, n: int, rng: random.Random) -> list[int]:
    model = session.model
    out: list[int] = []
    while len(out) < n:
        t = rng.randrange(model.n_vocab)
        if not model.is_control(t):
            out.append(t)
    return out


def bench_prefill(session: Session, n_tokens: int, repetitions: int, *, seed: int = 0) -> BenchResult:
    """Prefill `n_tokens` random tokens into an empty KV cache, `repetitions` times."""
    rng = random.Random(seed)
    tokens = _random_tokens(session, n_tokens, rng)
    session.context.memory_clear()
    session.tokens.clear()
    session.prefill(tokens[: min(16, n_tokens)])  # warm-up, as llama-bench does
    speeds = []
    for _ in range(repetitions):
        session.context.memory_clear()
        session.tokens.clear()
        t0 = time.perf_counter()
        session.prefill(tokens)
        session.context.synchronize()  # as llama-bench does: GPU and RPC decodes return early
        speeds.append(n_tokens / (time.perf_counter() - t0))
    return BenchResult(f"pp{n_tokens}", n_tokens, tuple(speeds))


def bench_decode(session: Session, n_tokens: int, repetitions: int, *, seed: int = 0) -> BenchResult:
    """Generate `n_tokens` tokens (greedy, EOS ignored) after a one-token prompt, `repetitions` times."""
    rng = random.Random(seed)
    prompt = _random_tokens(session, 1, rng)
    params = SamplingParams(temperature=0.0, max_tokens=n_tokens, ignore_eos=True)
    speeds = []
    for rep in range(repetitions + 1):  # the first run is a warm-up
        session.context.memory_clear()
        session.tokens.clear()
        done = next(e for e in session.generate(prompt, params) if isinstance(e, Completion))
        if rep:
            speeds.append(done.timings.decode_tps(done.usage.completion_tokens))
    return BenchResult(f"tg{n_tokens}", n_tokens, tuple(speeds))
