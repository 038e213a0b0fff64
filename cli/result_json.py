"""A completion as `--json` prints it (infer run) and infer batch writes each result."""

from __future__ import annotations

TYPE_CHECKING = False  # (typing costs the start-up of every call: cli/main.py)
if TYPE_CHECKING:
    from typing import Any


def result_json(model: str, c: Any) -> dict[str, Any]:
    """The --json result: text, why it ended, token counts and timings."""
    from infer.cli.speculation import usage_json

    t = c.timings
    return {
        "model": model,
        "text": c.text,
        **({"reasoning": c.reasoning} if getattr(c, "reasoning", None) is not None else {}),
        **({"tool_calls": c.tool_calls} if getattr(c, "tool_calls", None) is not None else {}),
        "finish_reason": c.finish_reason,
        "seed": c.seed,
        "usage": {
            "prompt_tokens": c.usage.prompt_tokens,
            "cached_tokens": c.usage.cached_tokens,
            "completion_tokens": c.usage.completion_tokens,
            **usage_json(c.usage),
            **({"reasoning_tokens": c.reasoning_tokens} if getattr(c, "reasoning", None) is not None else {}),
        },
        "timings": {
            "load_ms": round(t.load_ms, 3),
            "prefill_ms": round(t.prefill_ms, 3),
            "decode_ms": round(t.decode_ms, 3),
            "ttft_ms": round(t.ttft_ms, 3),
            "prefill_tokens_per_second": round(t.prefill_tps, 3),
            "decode_tokens_per_second": round(t.decode_tps(c.usage.completion_tokens), 3),
        },
    }
