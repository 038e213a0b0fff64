"""llama-server's /infill reply, which editor plugins (llama.vscode, llama.vim) read: its
completion shape, `content` with `stop`, `stop_type` (`eos`, `word`, `limit`),
`tokens_predicted` and `tokens_evaluated`, whole or streamed as `data:` events, the last one
with `stop: true`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from infer.server.mailbox import Mailbox
from infer.server.reply import Reply
from infer.server.streaming import Gone, OneChoice

_STOP_TYPE = {"eos": "eos", "stop": "word", "length": "limit", "cancelled": "limit"}


def _end(reply: Reply) -> dict[str, Any]:
    c = reply.first
    reason = c.finish_reason if c is not None else "eos"
    timings = {"prompt_n": reply.prompt_tokens - reply.cached_tokens, "predicted_n": reply.completion_tokens,
               "prompt_ms": c.timings.prefill_ms if c is not None else 0.0,
               "predicted_ms": c.timings.decode_ms if c is not None else 0.0}
    return {"model": reply.model, "stop": True, "stop_type": _STOP_TYPE.get(reason, "eos"),
            "stopping_word": (c.stop_string or "") if c is not None else "",
            "tokens_predicted": reply.completion_tokens, "tokens_evaluated": reply.prompt_tokens,
            "tokens_cached": reply.cached_tokens, "truncated": False, "timings": timings}


def whole(reply: Reply) -> dict[str, Any]:
    return {"content": reply.texts[0], "index": 0, **_end(reply)}


def _event(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


async def stream(reply: Reply, mailbox: Mailbox, choices: int, gone: Gone) -> AsyncIterator[bytes]:
    with OneChoice(reply, mailbox, choices, gone) as choice:
        while (pieces := await choice.next()) is not None:
            if pieces[1]:
                yield _event({"content": pieces[1], "index": 0, "stop": False})
        if reply.error is not None:
            yield _event({"error": {"code": 500, "message": reply.error, "type": "server_error"}})
            return
        yield _event({"content": "", "index": 0, **_end(reply)})
