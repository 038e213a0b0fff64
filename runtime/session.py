"""One conversation's tokens mirrored in the KV cache: prefix reuse, prefill, decoding.

The session remembers which tokens its KV cache holds. A new prompt keeps the
longest common prefix, removes the rest from the cache, and prefills only the
new suffix in ``n_batch`` chunks. Decoding runs on the native sampler chain:
per token, Python makes one sample call, one piece lookup and one decode call.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from infer.runtime.errors import ContextOverflowError
from infer.runtime.generation import Generation, Step
from infer.runtime.llama import Batch, Context, Model
from infer.runtime.media import MediaPrompt, run_start, spans
from infer.runtime.params import ContextParams
from infer.runtime.results import Completion, Piece, Timings
from infer.runtime.sampling import SamplingParams
from infer.runtime.speculative import DraftModel, Speculator

TYPE_CHECKING = False
if TYPE_CHECKING:
    from infer.runtime.thinking import ThinkingPlan

SEQ_ID = 0


_DIGESTS: dict[tuple[str, int, int], str] = {}
_DIGEST_SAMPLES = 16
_DIGEST_ENDS = 1 << 20  # bytes read at the start (header and metadata) and at the end
_DIGEST_SPAN = 1 << 16  # bytes read at each sample


def content_digest(path: Path) -> str:
    """A SHA-256 of a model file's size, its first and last MiB and 16 samples of 64 KiB between.

    It changes when the file's content does (any re-quantization or fine-tune changes
    the header and every sample) at the cost of a few reads, where hashing a
    multi-gigabyte file would take seconds. Remembered per (path, size, mtime).
    """
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        h = hashlib.sha256(str(st.st_size).encode())
        with path.open("rb") as f:
            h.update(f.read(_DIGEST_ENDS))
            step = max(st.st_size // (_DIGEST_SAMPLES + 1), 1)
            for offset in range(step, st.st_size, step)[:_DIGEST_SAMPLES]:
                f.seek(offset)
                h.update(f.read(_DIGEST_SPAN))
            f.seek(max(st.st_size - _DIGEST_ENDS, 0))
            h.update(f.read(_DIGEST_ENDS))
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


def state_fingerprint(model: Model, context: Context) -> dict[str, object]:
    """What a saved KV state of one sequence depends on: the model's content, the context's
    layout (llama.cpp loads a sequence's state only into as many KV streams as it came
    from), llama.cpp's build."""
    from infer.runtime.llama import llama_cpp_version

    p = context.params
    out: dict[str, object] = {
        "model_digest": content_digest(model.path), "n_ctx": context.n_ctx, "type_k": p.cache_type_k,
        "type_v": p.cache_type_v, "flash_attn": context.flash_attn, "llama_cpp": llama_cpp_version()}
    streams = 1 if context.kv_unified else p.n_seq_max
    if streams > 1:  # (absent for one stream, so that the keys of single-sequence states stay as they were)
        out["n_stream"] = streams
    return out


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Session:
    """A model, a context, and the token sequence its KV cache holds."""

    def __init__(self, model: Model, context: Context, *, load_ms: float = 0.0) -> None:
        self.model = model
        self.context = context
        self.load_ms = load_ms
        self.tokens: list[int] = []
        self._batch = Batch(context.n_batch)
        self.speculator: Speculator | None = None  # set by the caller to speculate

    @classmethod
    def open(cls, path: str | Path, params: ContextParams | None = None, *,
             devices: Sequence[int] | None = None) -> Session:
        """Load the model at `path` (mmap) and create a context for it.

        ``devices``: the ggml devices to offload to (see ``Model``)."""
        params = params or ContextParams()
        t0 = time.perf_counter()
        model = Model.load(path, params, devices=devices)
        try:
            context = Context(model, params)
        except BaseException:
            model.close()
            raise
        return cls(model, context, load_ms=(time.perf_counter() - t0) * 1000)

    @classmethod
    def open_in_background(cls, path: str | Path, params: ContextParams | None = None, *,
                           devices: Sequence[int] | None = None) -> Callable[[], Session]:
        """Start loading in a thread; return a function that waits for the Session.

        llama.cpp releases the GIL while it loads, so a one-shot run can import and
        compile its chat template meanwhile instead of after. Errors are raised by the
        returned function.
        """
        import threading

        outcome: list[Any] = []

        def load() -> None:
            try:
                outcome.append(cls.open(path, params, devices=devices))
            except BaseException as e:  # handed to the waiting caller
                outcome.append(e)

        thread = threading.Thread(target=load, name="infer-load", daemon=True)
        thread.start()

        def wait() -> Session:
            thread.join()
            if isinstance(outcome[0], BaseException):
                raise outcome[0]
            return outcome[0]

        return wait

    def close(self) -> None:
        if self.speculator is not None:
            self.speculator.close()
            self.speculator = None
        self._batch.close()
        self.context.close()
        self.model.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def n_ctx(self) -> int:
        return self.context.n_ctx

    def check_fits(self, n_prompt: int, max_tokens: int | None) -> None:
        """Fail before any work if the prompt and the requested tokens exceed the context."""
        wanted = n_prompt + (max_tokens or 0)
        if n_prompt >= self.n_ctx or wanted > self.n_ctx:
            raise ContextOverflowError(prompt_tokens=n_prompt, max_tokens=max_tokens,
                                       n_ctx=self.n_ctx)

    def prefill(self, tokens: Sequence[int], *, checkpoints: Sequence[int] = (),
                on_checkpoint: Callable[[int], None] | None = None,
                media_prompt: MediaPrompt | None = None) -> int:
        """Bring the KV cache to hold exactly `tokens`; return how many were reused.

        Where `tokens` hold media (runtime/media.py), `media_prompt` has their chunks: each
        medium not already in the cache is encoded and its embeddings decoded whole.

        The logits of the last token are computed, ready for sampling. When the cache
        holds ``tokens[:n]`` for a position n in `checkpoints` (that had to be
        prefilled), ``on_checkpoint(n)`` is called: the prompt cache saves states there.
        """
        if not tokens:
            raise ValueError("cannot prefill an empty prompt")
        keep = common_prefix_len(self.tokens, tokens)
        if keep == len(tokens):
            keep -= 1  # the last token must be decoded again to get its logits
        keep = run_start(tokens, keep)  # (a medium is evaluated whole)
        if not self.context.memory_seq_rm(SEQ_ID, keep, -1):
            self.context.memory_clear()  # a cache that cannot cut mid-sequence starts over
            keep = 0
        del self.tokens[keep:]
        media = media_prompt.media if media_prompt is not None else {}
        stops = sorted({n for n in checkpoints if keep < n < len(tokens) and run_start(tokens, n) == n}
                       | {len(tokens)})
        pos = keep
        with self.context.interruptible():
            for stop in stops:
                for start, end, medium in spans(tokens, pos, stop, self._batch.capacity, media):
                    if medium is not None:
                        assert media_prompt is not None
                        media_prompt.projector.evaluate(self.context, medium, start, SEQ_ID,
                                                        logits_last=end >= stop)
                    else:
                        self._batch.set_tokens(tokens[start:end], start_pos=start, seq_id=SEQ_ID,
                                               logits_last=end >= stop)
                        self.context.decode(self._batch)
                    self.tokens.extend(tokens[start:end])
                pos = stop
                if on_checkpoint is not None and stop in checkpoints:
                    on_checkpoint(stop)
        return keep

    def fingerprint(self) -> dict[str, object]:
        return state_fingerprint(self.model, self.context)

    def save_state(self) -> tuple[list[int], bytes]:
        """The tokens the KV cache holds and its state."""
        return list(self.tokens), self.context.seq_state(SEQ_ID)

    def restore_state(self, tokens: list[int], data: bytes) -> bool:
        """Put a saved KV state back; False (and an empty cache) if it does not load."""
        self.context.memory_clear()
        self.tokens.clear()
        if not self.context.set_seq_state(data, SEQ_ID):
            self.context.memory_clear()
            return False
        self.tokens.extend(tokens)
        return True

    def decode_token(self, token: int) -> None:
        """Append one token to the KV cache and compute its logits."""
        self._batch.set_one(token, len(self.tokens), SEQ_ID)
        self.context.decode(self._batch)
        self.tokens.append(token)

    def time_decode(self, n: int) -> float:
        """Seconds one decode of n tokens after the cache's contents takes, with logits for
        each (as a verification step); the cache is left as it was, its last logits are not."""
        pos = len(self.tokens)
        filler = self.tokens[-1] if self.tokens else max(self.model.bos, 0)
        self._batch.set_tokens([filler] * n, start_pos=pos, seq_id=SEQ_ID, logits_all=True)
        t0 = time.perf_counter()
        self.context.decode(self._batch)
        self.context.synchronize()  # a GPU's decode returns before it is done
        seconds = time.perf_counter() - t0
        self.context.memory_seq_rm(SEQ_ID, pos, -1)
        return seconds

    def _calibrate(self, spec: Speculator) -> None:
        """Measure the speculator's costs here, after the prompt (a depth like the ones it will
        verify at), then compute the last token's logits again for the first sample."""
        draft = spec.proposer.session if isinstance(spec.proposer, DraftModel) else None
        spec.calibrate(self.time_decode, self.n_ctx - len(self.tokens),
                       (lambda: draft.time_decode(1)) if draft is not None else None)
        last = self.tokens.pop()
        self.context.memory_seq_rm(SEQ_ID, len(self.tokens), -1)
        self.decode_token(last)

    def generate(self, prompt: Sequence[int], params: SamplingParams, *, checkpoints: Sequence[int] = (),
                 on_checkpoint: Callable[[int], None] | None = None, started: float | None = None,
                 thinking: ThinkingPlan | None = None, media_prompt: MediaPrompt | None = None
                 ) -> Iterator[Piece | Completion]:
        """Prefill `prompt`, then sample until EOS, a stop string, or the token limit. Yields
        ``Piece`` events as text becomes final, then one ``Completion``.
        `checkpoints` and `on_checkpoint` are passed to `prefill`. `started` (a `time.perf_counter()`
        value) is when the request began, if earlier than this call (a state loaded from the prompt
        cache): prefill and first-token times count from it.
        With a speculator (``self.speculator``), each step may verify several guessed tokens.
        A thinking model's reply follows its prompt's `thinking` plan (runtime/thinking.py): the
        session closes the reasoning block itself when the plan's budget is spent. `media_prompt`:
        the media in `prompt` (runtime/media.py; no speculation: a draft cannot read them)."""
        self.check_fits(len(prompt), params.max_tokens)
        params = params.with_seed()
        t_start = time.perf_counter() if started is None else started
        spec = self.speculator if media_prompt is None else None
        limit = self.n_ctx - len(prompt)
        if params.max_tokens is not None:
            limit = min(limit, params.max_tokens)
        gen = Generation(self.model, params, limit, spec, thinking=thinking)
        try:
            cached = self.prefill(prompt, checkpoints=checkpoints, on_checkpoint=on_checkpoint,
                                  media_prompt=media_prompt)
            t_prefilled = time.perf_counter()
            calibrating = spec is not None and spec.needs_profile and limit > 1
            if spec is not None and calibrating:
                self._calibrate(spec)  # once per model and settings
            t_decoding = time.perf_counter()
            if spec is not None:
                spec.start(prompt)
            finish, t_first = "length", time.perf_counter()  # (with limit 0: the end of prefill)
            if limit > 0:
                step = gen.step(self.context, -1)  # the first token, from the prompt's logits
                t_first = time.perf_counter()
                while True:
                    if step.text:
                        yield Piece(step.text)
                    if step.next_token is None:
                        finish = step.finish or "length"
                        break
                    if gen.thinking_due():
                        step = self._close_thinking(gen, step.next_token)
                    else:
                        step = self._step(gen, step.next_token)
            tail = gen.stream.finish()
            if tail:
                yield Piece(tail)
            t_end = time.perf_counter()
        finally:
            gen.close()
        timings = Timings(
            load_ms=self.load_ms,
            prefill_ms=(t_prefilled - t_start) * 1000,
            decode_ms=(t_end - t_decoding) * 1000,
            ttft_ms=(t_first - t_start) * 1000,
            prefill_tokens=len(prompt) - cached,
            calibration_ms=(t_decoding - t_prefilled) * 1000 if calibrating else 0.0,
        )
        yield gen.completion(finish, len(prompt), cached, timings)

    def _close_thinking(self, gen: Generation, token: int) -> Step:
        """Decode the pending `token`, then the reasoning's closing marker as if the model had
        written it (--reasoning-budget); then the next step of `gen`."""
        text, closer, ended = gen.write_closer(token)
        if ended is not None:
            return Step(text, ended, None, 0)
        n_past = len(self.tokens)
        self._batch.set_tokens([token, *closer], start_pos=n_past, seq_id=SEQ_ID)
        self.context.decode(self._batch)
        self.tokens.extend((token, *closer))
        step = gen.step(self.context, -1)
        return Step(text + step.text, step.finish, step.next_token, 0)

    def _step(self, gen: Generation, token: int) -> Step:
        """Decode the pending `token` (and what the speculator guesses after it: never past the
        token limit or the context), then take the next step of `gen`."""
        room = min(gen.limit - len(gen.generated), self.n_ctx - len(self.tokens) - 1)
        guesses = gen.propose(token, room)
        if not guesses:
            self.decode_token(token)
            return gen.step(self.context, -1)
        n_past = len(self.tokens)
        self._batch.set_tokens([token, *guesses], start_pos=n_past, seq_id=SEQ_ID, logits_all=True)
        self.context.decode(self._batch)
        self.tokens.extend((token, *guesses))
        step = gen.step(self.context, 0, guesses)
        # The KV cache keeps the pending token and the right guesses: the next token follows them.
        kept = len(self.tokens) - step.rejected
        self.context.memory_seq_rm(SEQ_ID, kept, -1)
        del self.tokens[kept:]
        return step
