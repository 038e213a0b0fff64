"""What a generation yields: text as it becomes final, then its Completion (usage, timings).

Plain data, importable without llama.cpp: `infer run` through a server builds the same
Completion from the server's reply.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Usage:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens that were already in the KV cache
    completion_tokens: int = 0
    draft_tokens: int = 0  # guessed tokens that speculation had the model verify
    accepted_tokens: int = 0  # of those, the ones that became output


@dataclass
class Timings:
    load_ms: float = 0.0
    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    ttft_ms: float = 0.0  # from the start of the request to the first sampled token
    prefill_tokens: int = 0  # tokens actually prefilled (prompt minus cached)
    calibration_ms: float = 0.0  # speculation's one-time cost measurement, before the first token

    @property
    def prefill_tps(self) -> float:
        return self.prefill_tokens / (self.prefill_ms / 1000) if self.prefill_ms > 0 else 0.0

    def decode_tps(self, completion_tokens: int) -> float:
        return completion_tokens / (self.decode_ms / 1000) if self.decode_ms > 0 else 0.0


@dataclass
class Piece:
    """Text that is final and can be shown."""

    text: str


@dataclass
class Completion:
    """The end of a generation: what was produced, why it ended, and what it cost."""

    text: str
    finish_reason: str  # "eos", "stop" (a stop string), or "length"
    usage: Usage
    timings: Timings
    seed: int | None
    stop_string: str | None = None
    tokens: list[int] = field(default_factory=list, repr=False)
