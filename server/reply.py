"""The choices of one response as they grow, in OpenAI's shapes: the whole body of a
response, or the chunks of a stream."""

from __future__ import annotations

import time
import uuid
from typing import Any

from infer.runtime.reasoning import ReasoningSplitter, reasoning_tokens
from infer.runtime.request import Delta, Outcome, TokenLogprob
from infer.runtime.tool_stream import CallStarted, ToolCallStream
from infer.server import schema
from infer.server.metrics import ModelMetrics
from infer.server.models import Served

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "length"}


class Reply:
    """The choices of one response as they grow, in OpenAI's shapes."""

    def __init__(self, served: Served, gen: schema.Generation, prompt_tokens: int,
                 metrics: ModelMetrics, thinking: Any = None, calls: Any = None) -> None:
        self.served, self.gen, self.metrics = served, gen, metrics
        self.model = served.name
        self.id = ("chatcmpl-" if gen.chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.prompt_tokens = prompt_tokens
        self.texts = [""] * gen.n
        self.logprobs: list[list[TokenLogprob]] = [[] for _ in range(gen.n)]
        self.finish: list[str | None] = [None] * gen.n
        self.tokens: list[list[int]] = [[] for _ in range(gen.n)]
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.error: str | None = None
        self.first: Any = None  # the first choice's Completion (for the `infer` extension)
        # A thinking model's chat: each choice's reasoning apart from its content (reasoning_content)
        # (`thinking`: its runtime.thinking.ThinkingPrompt; reasoning_format none: not apart)
        splits = [thinking.splitter() for _ in range(gen.n)] if thinking is not None else []
        self.splits: list[ReasoningSplitter] | None = splits if splits and splits[0] is not None else None
        model = served.model
        self.token_bytes = thinking.plan.token_bytes(model) if self.splits else model.token_bytes
        self.reasonings = [""] * gen.n
        self.reasoning_tokens = 0
        self.flushed: set[int] = set()
        # Tool calls: each choice's content read for calls (`calls`: the model's ToolSyntax)
        self.calls: list[ToolCallStream] | None = None
        if calls is not None:
            self.calls = [ToolCallStream(calls, gen.tools.tools, single=not gen.tools.parallel)
                          for _ in range(gen.n)]

    def add(self, choice: int, delta: Delta) -> None:
        self._take(choice, *self._split(choice, delta.text))
        self.logprobs[choice] += delta.logprobs

    def _split(self, choice: int, text: str) -> tuple[str, str, list[Any]]:
        """The reasoning, the content and the tool-call events of a choice's new text."""
        reasoning, content = self.splits[choice].feed(text) if self.splits is not None else ("", text)
        if not self.calls:
            return reasoning, content, []
        return (reasoning, *_parts(self.calls[choice].feed(content)))

    def _flush(self, choice: int) -> tuple[str, str, list[Any]]:
        """What a choice's splitters still held (once: at its end)."""
        if choice in self.flushed:
            return "", "", []
        self.flushed.add(choice)
        reasoning, content = self.splits[choice].finish() if self.splits is not None else ("", "")
        if not self.calls:
            return reasoning, content, []
        stream = self.calls[choice]
        return (reasoning, *_parts([*stream.feed(content), *stream.finish()]))

    def pieces(self, choice: int, delta: Delta) -> tuple[str, str, list[Any]]:
        """A Delta's reasoning, content and tool-call events (recorded), for a front end that
        streams them in a shape of its own."""
        reasoning, content, calls = self._split(choice, delta.text)
        self._take(choice, reasoning, content)
        return reasoning, content, calls

    def end_pieces(self, choice: int, outcome: Outcome) -> tuple[str, str, list[Any]]:
        """What a choice's splitters still held (recorded), then its end."""
        tail = self._flush(choice)
        self._take(choice, *tail)
        self.end(choice, outcome)
        return tail

    def _take(self, choice: int, reasoning: str, content: str, _calls: Any = None) -> None:
        self.reasonings[choice] += reasoning
        self.texts[choice] += content

    def end(self, choice: int, outcome: Outcome) -> None:
        self._take(choice, *self._flush(choice))
        completion = outcome.completion
        if completion is None:  # failed after it was accepted (the model failed, or shutdown)
            self.metrics.errors += 1
            self.error = outcome.error
            self.finish[choice] = "length"
            return
        self.finish[choice] = FINISH.get(completion.finish_reason, "stop")
        if self.calls and self.done_calls(choice) and self.finish[choice] == "stop":
            self.finish[choice] = "tool_calls"
        self.tokens[choice] = completion.tokens
        self.completion_tokens += completion.usage.completion_tokens
        if self.splits is not None and self.reasonings[choice]:
            self.reasoning_tokens += reasoning_tokens(self.token_bytes, completion.tokens,
                                                      completion.text, self.splits[choice].answer_from)
        if choice == 0:
            self.cached_tokens = completion.usage.cached_tokens
            self.first = completion
        reason = "abort" if completion.finish_reason == "cancelled" else self.finish[choice]
        self.metrics.ended(completion.usage, completion.timings, reason)

    def usage(self) -> dict[str, Any]:
        usage = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                 "total_tokens": self.prompt_tokens + self.completion_tokens,
                 "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}
        if self.splits is not None:
            usage["completion_tokens_details"] = {"reasoning_tokens": self.reasoning_tokens}
        return usage

    def extension(self) -> dict[str, Any]:
        """infer's own figures of the first choice, as `infer run --json` reports them (what
        `infer run` prints through a server): why it ended, the seed, speculation, timings."""
        c = self.first
        if c is None:
            return {}
        t = c.timings
        return {"infer": {"finish_reason": c.finish_reason, "seed": c.seed,
                          "draft_tokens": c.usage.draft_tokens, "accepted_tokens": c.usage.accepted_tokens,
                          "timings": {"prefill_ms": t.prefill_ms, "decode_ms": t.decode_ms,
                                      "ttft_ms": t.ttft_ms, "prefill_tokens": t.prefill_tokens}}}

    def _logprobs(self, entries: list[TokenLogprob]) -> dict[str, Any] | None:
        if self.gen.logprobs is None:
            return None
        model = self.served.model

        def piece(token: int) -> tuple[str, list[int]]:
            data = model.token_bytes(token)
            return data.decode("utf-8", errors="replace"), list(data)

        if self.gen.chat:
            content = []
            for e in entries:
                text, data = piece(e.token)
                top = []
                for t, lp in e.top:
                    top_text, top_data = piece(t)
                    top.append({"token": top_text, "logprob": lp, "bytes": top_data})
                content.append({"token": text, "logprob": e.logprob, "bytes": data, "top_logprobs": top})
            return {"content": content}
        return {"tokens": [piece(e.token)[0] for e in entries],
                "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": [{piece(t)[0]: lp for t, lp in e.top} for e in entries],
                "text_offset": _offsets([piece(e.token)[0] for e in entries])}

    def _body(self, kind: str, choices: list[dict[str, Any]], *, usage: bool) -> dict[str, Any]:
        """A response's (or a chunk's) fields around its choices, in OpenAI's order; `usage`
        adds the token counts and infer's extension."""
        head = {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "choices": choices}
        if usage:
            return {**head, "usage": self.usage(), "system_fingerprint": None, **self.extension()}
        return {**head, "system_fingerprint": None}

    def _chunk_kind(self) -> str:
        return "chat.completion.chunk" if self.gen.chat else "text_completion"

    def whole(self) -> dict[str, Any]:
        if self.gen.chat:
            choices = [{"index": i, "message": self._message(i), "logprobs": self._logprobs(self.logprobs[i]),
                        "finish_reason": self.finish[i]} for i in range(self.gen.n)]
            kind = "chat.completion"
        else:
            choices = [{"index": i, "text": self.texts[i], "logprobs": self._logprobs(self.logprobs[i]),
                        "finish_reason": self.finish[i]} for i in range(self.gen.n)]
            kind = "text_completion"
        if self.gen.return_tokens:  # llama-server's extension: the generated token ids
            for i, choice in enumerate(choices):
                choice["tokens"] = self.tokens[i]
        return self._body(kind, choices, usage=True)

    def chunk(self, choice: int, delta: dict[str, Any], finish: str | None = None,
              logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        if self.gen.chat:
            body = {"index": choice, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        else:
            body = {"index": choice, "text": delta.get("content", ""), "logprobs": logprobs,
                    "finish_reason": finish}
        return self._body(self._chunk_kind(), [body], usage=False)

    def done_calls(self, choice: int) -> list[Any]:
        return [c for c in self.calls[choice].calls if c.done] if self.calls else []

    def _message(self, choice: int) -> dict[str, Any]:
        calls = self.done_calls(choice)
        content = self.texts[choice]
        message: dict[str, Any] = {"role": "assistant",
                                   "content": content.strip() or None if calls else content}
        if self.reasonings[choice]:  # (llama-server's and vLLM's field)
            message["reasoning_content"] = self.reasonings[choice]
        if calls:
            message["tool_calls"] = [c.as_openai() for c in calls]
        return message

    def delta_chunks(self, choice: int, delta: Delta) -> list[dict[str, Any]]:
        """The chunks of a Delta: its content, a thinking model's reasoning apart, and tool
        calls (none while a marker may be starting)."""
        if self.splits is None and self.calls is None:
            return [self.chunk(choice, {"content": delta.text}, logprobs=self._logprobs(delta.logprobs))]
        return self._split_chunks(choice, *self._split(choice, delta.text), delta.logprobs)

    def _split_chunks(self, choice: int, reasoning: str, content: str, calls: list[Any],
                      logprobs: list[TokenLogprob]) -> list[dict[str, Any]]:
        fields = {**({"reasoning_content": reasoning} if reasoning else {}),
                  **({"content": content} if content else {})}
        self._take(choice, reasoning, content)
        chunks = [self.chunk(choice, fields, logprobs=self._logprobs(logprobs))] if fields or logprobs else []
        return chunks + [self.chunk(choice, {"tool_calls": [_call_delta(e)]}) for e in calls]

    def end_chunks(self, choice: int, outcome: Outcome) -> list[dict[str, Any]]:
        """What a choice's splitter still held, then its end."""
        tail = self._split_chunks(choice, *self._flush(choice), [])
        self.end(choice, outcome)
        return [*tail, self.chunk(choice, {}, finish=self.finish[choice])]

    def usage_chunk(self) -> dict[str, Any]:
        return self._body(self._chunk_kind(), [], usage=True)


def _parts(events: list[Any]) -> tuple[str, list[Any]]:
    """Tool-call events apart from the content among them."""
    return "".join(e for e in events if isinstance(e, str)), [e for e in events if not isinstance(e, str)]


def _call_delta(event: Any) -> dict[str, Any]:
    """A tool call's start (its id and name) or a piece of its arguments, as OpenAI streams them."""
    if isinstance(event, CallStarted):
        return {"index": event.index, "id": event.id, "type": "function",
                "function": {"name": event.name, "arguments": ""}}
    return {"index": event.index, "function": {"arguments": event.text}}


def _offsets(pieces: list[str]) -> list[int]:
    out, at = [], 0
    for p in pieces:
        out.append(at)
        at += len(p)
    return out
