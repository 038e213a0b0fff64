"""What a verification batch costs: ``CostModel`` (seconds per batch size, as measured) and
``measure_batches``, which measures a model's profile once."""

from __future__ import annotations

import time
from collections.abc import Callable


class CostModel:
    """Seconds one decode of a batch of n tokens takes, for n = 1 .. max_n, as measured.

    Each size keeps a moving average of its own timings. Batches of two or more tokens
    are then fitted with a line robust to outliers (Siegel's repeated median of the
    slopes between measured sizes, then the median intercept): a shared machine's hiccup at one size
    does not rule that size out for the rest of the run, and sizes never measured are
    read off the line. Until two sizes are measured, an extra token is assumed to cost
    half a single-token step. A Speculator fills it from its measured profile; the
    scheduler (``infer batch``) with the timings of its own steps, and compares sizes with
    `ratio` (it never decodes a single token).
    """

    PRIOR_SLOPE = 0.5
    WEIGHT = 0.2  # of a new timing in the moving average

    def __init__(self, max_n: int) -> None:
        self.max_n = max_n
        self.seconds: dict[int, float] = {}
        self._line: tuple[float, float] | None = None  # (seconds at n = 2, seconds per extra token)

    def observe(self, n: int, seconds: float) -> None:
        if not 1 <= n <= self.max_n or seconds <= 0:
            return
        old = self.seconds.get(n)
        if old is not None:  # one stall of a shared machine moves the average a little only
            seconds = min(seconds, 2 * old)
        self.seconds[n] = seconds if old is None else old + self.WEIGHT * (seconds - old)
        self._line = None

    def _fit(self) -> tuple[float, float] | None:
        if self._line is None:
            points = sorted((n, t) for n, t in self.seconds.items() if n >= 2)
            one = self.seconds.get(1)
            if not points:
                if one is None:
                    return None
                self._line = (one * (1 + self.PRIOR_SLOPE), one * self.PRIOR_SLOPE)
            elif len(points) == 1:
                n, t = points[0]
                if one is None:  # the single step this size would be under the prior
                    one = t / (1 + self.PRIOR_SLOPE * (n - 1))
                slope = one * self.PRIOR_SLOPE
                self._line = (t - slope * (n - 2), slope)
            else:
                import statistics  # not at start-up: fractions and decimal cost ~7 ms of every run

                slope = max(statistics.median(  # Siegel's repeated median
                    statistics.median((t2 - t1) / (n2 - n1) for n2, t2 in points if n2 != n1)
                    for n1, t1 in points), 0.0)
                at2 = statistics.median(t - slope * (n - 2) for n, t in points)
                self._line = (at2, slope)
        return self._line

    def seconds_at(self, n: int) -> float | None:
        """The estimated seconds of a batch of n tokens; None before anything was measured."""
        line = self._fit()
        if line is None:
            return None
        at2, slope = line
        if n <= 1:
            one = self.seconds.get(1)
            return one if one is not None else max(at2 - slope, 1e-9)
        return max(at2 + slope * (n - 2), 1e-9)

    def ratio(self, n: int, m: int) -> float:
        """The cost of a batch of m tokens relative to one of n (at least 1 when m >= n)."""
        a, b = self.seconds_at(n), self.seconds_at(m)
        if a is None or b is None:
            a, b = 1 + self.PRIOR_SLOPE * (max(n, 1) - 1), 1 + self.PRIOR_SLOPE * (max(m, 1) - 1)
        return max(b / a, 1.0) if m >= n else b / a

    def cost(self, n: int) -> float:
        """The cost of a batch of n tokens relative to a single-token step."""
        return 1.0 if n <= 1 else self.ratio(1, n)



def measure_batches(measure: Callable[[int], float], max_n: int, budget_s: float) -> dict[int, float]:
    """What a step of n tokens costs, in seconds, for n = 1 .. max_n.

    A plain step is a single-token decode in a run of them (a GPU replays those from a
    CUDA graph, much faster than it launches a batch's kernels). A step of n > 1 is its
    batch plus what it adds to the single step after it (the graph captured again), so
    both are timed together. Each size takes the fastest of two tries, in an order that
    covers the range early (1, max_n, the middle, then the gaps between); measuring
    stops once `budget_s` is spent, three sizes at least. The CostModel reads the sizes
    left out off its line."""
    order, spans = [max_n] if max_n > 1 else [], [(1, max_n)]
    while spans:
        lo, hi = spans.pop(0)
        if hi - lo > 1:
            mid = (lo + hi) // 2
            order.append(mid)
            spans += [(lo, mid), (mid, hi)]
    deadline = time.perf_counter() + budget_s
    for _ in range(2):  # warm-up
        measure(1)
    single = min(measure(1) for _ in range(4))
    best: dict[int, float] = {1: single}
    for _ in range(2):
        for n in order:
            if len(best) >= min(3, len(order) + 1) and time.perf_counter() > deadline:
                return best
            seconds = measure(n) + max(measure(1) - single, 0.0)
            best[n] = min(best.get(n, seconds), seconds)
    return best
