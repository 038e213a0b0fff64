"""`GET /metrics`: Prometheus's text format, with names in the style vLLM uses (``infer:``).

Counters and histograms are updated on the event loop as requests end; the gauges
(requests running and waiting, KV cache use) are read from the engines when scraped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from infer.runtime.results import Timings, Usage

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
TPOT_BUCKETS = (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)


@dataclass
class Histogram:
    buckets: Sequence[float]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * len(self.buckets)
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.n += 1

    def lines(self, name: str, labels: str) -> Iterable[str]:
        counts = self.counts or [0] * len(self.buckets)
        for bound, count in zip(self.buckets, counts, strict=True):
            yield f'{name}_bucket{{{labels},le="{bound}"}} {count}'
        yield f'{name}_bucket{{{labels},le="+Inf"}} {self.n}'
        yield f"{name}_sum{{{labels}}} {self.total}"
        yield f"{name}_count{{{labels}}} {self.n}"


@dataclass
class ModelMetrics:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens found in the KV cache (the prefix cache's hits, in tokens)
    generation_tokens: int = 0
    prefix_queries: int = 0  # requests that looked for a cached prefix
    prefix_hits: int = 0  # ... and found one
    finished: dict[str, int] = field(default_factory=dict)  # by finish reason
    errors: int = 0
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    tpot: Histogram = field(default_factory=lambda: Histogram(TPOT_BUCKETS))

    def ended(self, u: Usage, t: Timings, finish_reason: str) -> None:
        self.prompt_tokens += u.prompt_tokens
        self.cached_tokens += u.cached_tokens
        self.generation_tokens += u.completion_tokens
        self.prefix_queries += 1
        self.prefix_hits += u.cached_tokens > 0
        self.finished[finish_reason] = self.finished.get(finish_reason, 0) + 1
        if u.completion_tokens:
            self.ttft.observe(t.ttft_ms / 1000)
        if u.completion_tokens > 1:
            self.tpot.observe(t.decode_ms / 1000 / (u.completion_tokens - 1))


class Metrics:
    def __init__(self) -> None:
        self.models: dict[str, ModelMetrics] = {}

    def of(self, model: str) -> ModelMetrics:
        return self.models.setdefault(model, ModelMetrics())

    def render(self, gauges: dict[str, tuple[int, int, float, int]]) -> str:
        """The text format; `gauges`: model -> (running, waiting, KV cache use 0..1, requests
        preempted) of loaded ones."""
        names = sorted(set(self.models) | set(gauges))
        out: list[str] = []

        def family(name: str, kind: str, help: str, rows: Iterable[str]) -> None:
            out.append(f"# HELP {name} {help}")
            out.append(f"# TYPE {name} {kind}")
            out.extend(rows)

        def label(model: str) -> str:
            escaped = model.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
            return f'model_name="{escaped}"'

        def per_model(name: str, value: object) -> Iterable[str]:
            for m in names:
                yield f"{name}{{{label(m)}}} {value(m) if callable(value) else value}"

        zero = ModelMetrics()

        def counter(m: str) -> ModelMetrics:
            return self.models.get(m, zero)

        family("infer:num_requests_running", "gauge", "Requests in the running batch.",
               per_model("infer:num_requests_running", lambda m: gauges.get(m, (0, 0, 0.0, 0))[0]))
        family("infer:num_requests_waiting", "gauge", "Requests waiting for a slot.",
               per_model("infer:num_requests_waiting", lambda m: gauges.get(m, (0, 0, 0.0, 0))[1]))
        family("infer:kv_cache_usage_perc", "gauge", "Share of KV cache cells holding tokens (0 to 1).",
               per_model("infer:kv_cache_usage_perc", lambda m: round(gauges.get(m, (0, 0, 0.0, 0))[2], 6)))
        family("infer:num_preemptions_total", "counter",
               "Requests suspended so that others had KV cells (they resume).",
               per_model("infer:num_preemptions_total", lambda m: gauges.get(m, (0, 0, 0.0, 0))[3]))
        family("infer:prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
               per_model("infer:prompt_tokens_total", lambda m: counter(m).prompt_tokens))
        family("infer:cached_prompt_tokens_total", "counter", "Prompt tokens found in the KV cache.",
               per_model("infer:cached_prompt_tokens_total", lambda m: counter(m).cached_tokens))
        family("infer:generation_tokens_total", "counter", "Generated tokens.",
               per_model("infer:generation_tokens_total", lambda m: counter(m).generation_tokens))
        family("infer:prefix_cache_queries_total", "counter", "Requests that looked up a cached prefix.",
               per_model("infer:prefix_cache_queries_total", lambda m: counter(m).prefix_queries))
        family("infer:prefix_cache_hits_total", "counter", "Requests that found a cached prefix.",
               per_model("infer:prefix_cache_hits_total", lambda m: counter(m).prefix_hits))
        family("infer:request_success_total", "counter", "Finished requests, by finish reason.",
               (f'infer:request_success_total{{{label(m)},finished_reason="{reason}"}} {count}'
                for m in names for reason, count in sorted(counter(m).finished.items())))
        family("infer:request_errors_total", "counter", "Requests that failed after they were accepted.",
               per_model("infer:request_errors_total", lambda m: counter(m).errors))
        family("infer:time_to_first_token_seconds", "histogram", "Time to first token.",
               (line for m in names for line in counter(m).ttft.lines("infer:time_to_first_token_seconds",
                                                                        label(m))))
        family("infer:time_per_output_token_seconds", "histogram", "Time per output token after the first.",
               (line for m in names for line in counter(m).tpot.lines("infer:time_per_output_token_seconds",
                                                                        label(m))))
        return "\n".join(out) + "\n"
