"""What a generation yields: text as it becomes final, then its Completion (usage, timings).

Plain data, importable without llama.cpp: `infer run` through a server builds the same
Completion from the server's reply. Plain classes rather than dataclasses, because that
client imports this module and `dataclasses` (with `inspect`) costs it about 9 ms of
start-up; `_Record` gives them a dataclass's equality and repr.
"""

from __future__ import annotations

TYPE_CHECKING = False  # (typing costs the start-up of `infer run`: cli/main.py)
if TYPE_CHECKING:
    from typing import Any


class _Record:
    __slots__: tuple[str, ...] = ()
    _order: tuple[str, ...] = ()  # the fields, in the constructor's order
    _hidden: tuple[str, ...] = ()  # fields left out of the repr

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self._order)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]  # (mutable, as a dataclass without frozen=True)

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._order
                          if name not in self._hidden)
        return f"{type(self).__name__}({shown})"


class Usage(_Record):
    _order = ("prompt_tokens", "cached_tokens", "completion_tokens", "draft_tokens", "accepted_tokens")
    __slots__ = _order

    def __init__(self, prompt_tokens: int = 0, cached_tokens: int = 0, completion_tokens: int = 0,
                 draft_tokens: int = 0, accepted_tokens: int = 0) -> None:
        self.prompt_tokens = prompt_tokens
        self.cached_tokens = cached_tokens  # prompt tokens that were already in the KV cache
        self.completion_tokens = completion_tokens
        self.draft_tokens = draft_tokens  # guessed tokens that speculation had the model verify
        self.accepted_tokens = accepted_tokens  # of those, the ones that became output


class Timings(_Record):
    _order = ("load_ms", "prefill_ms", "decode_ms", "ttft_ms", "prefill_tokens", "calibration_ms")
    __slots__ = _order

    def __init__(self, load_ms: float = 0.0, prefill_ms: float = 0.0, decode_ms: float = 0.0,
                 ttft_ms: float = 0.0, prefill_tokens: int = 0, calibration_ms: float = 0.0) -> None:
        self.load_ms = load_ms
        self.prefill_ms = prefill_ms
        self.decode_ms = decode_ms
        self.ttft_ms = ttft_ms  # from the start of the request to the first sampled token
        self.prefill_tokens = prefill_tokens  # tokens actually prefilled (prompt minus cached)
        self.calibration_ms = calibration_ms  # speculation's cost measurement, once, before the first token

    @property
    def prefill_tps(self) -> float:
        return self.prefill_tokens / (self.prefill_ms / 1000) if self.prefill_ms > 0 else 0.0

    def decode_tps(self, completion_tokens: int) -> float:
        return completion_tokens / (self.decode_ms / 1000) if self.decode_ms > 0 else 0.0


class Piece(_Record):
    """Text that is final and can be shown."""

    _order = ("text",)
    __slots__ = _order

    def __init__(self, text: str) -> None:
        self.text = text


class Thought(_Record):
    """A thinking model's reasoning that is final, apart from the answer (what a server sends
    as `reasoning_content`)."""

    _order = ("text",)
    __slots__ = _order

    def __init__(self, text: str) -> None:
        self.text = text


class Completion(_Record):
    """The end of a generation: what was produced, why it ended, and what it cost."""

    _order = ("text", "finish_reason", "usage", "timings", "seed", "stop_string", "tokens", "reasoning",
              "reasoning_tokens", "tool_calls")
    __slots__ = _order
    _hidden = ("tokens",)

    def __init__(self, text: str, finish_reason: str, usage: Usage, timings: Timings, seed: int | None,
                 stop_string: str | None = None, tokens: list[int] | None = None,
                 reasoning: str | None = None, reasoning_tokens: int = 0,
                 tool_calls: list[dict[str, Any]] | None = None) -> None:
        self.text = text
        self.finish_reason = finish_reason  # "eos", "stop" (a stop string), or "length"
        self.usage = usage
        self.timings = timings
        self.seed = seed
        self.stop_string = stop_string
        self.tokens = [] if tokens is None else tokens
        self.reasoning = reasoning  # a thinking model's reasoning, apart from `text` (None: no convention)
        self.reasoning_tokens = reasoning_tokens  # of the completion tokens, those of the reasoning
        # Where tools were given: the calls read from the reply, in OpenAI's shape, `text` then
        # holds only the content (runtime/tool_stream.split_calls); None: no tools.
        self.tool_calls = tool_calls

    def message(self) -> dict[str, Any]:
        """The reply as a conversation's assistant message, a thinking model's reasoning kept for
        the template (`reasoning_content`), and its tool calls."""
        reasoning = {"reasoning_content": self.reasoning} if self.reasoning else {}
        calls = {"tool_calls": self.tool_calls} if self.tool_calls else {}
        return {"role": "assistant", "content": self.text, **reasoning, **calls}
