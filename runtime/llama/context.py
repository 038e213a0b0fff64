"""An inference context (``Context``: the KV cache and compute buffers of one model), the
native token ``Batch`` it decodes, and the flash-attention setting it asks llama.cpp for."""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from infer.runtime.errors import LlamaError, ResourceError, UsageError
from infer.runtime.llama.bindings import C, physical_cores
from infer.runtime.log import logger
from infer.runtime.params import ContextParams

if TYPE_CHECKING:
    from infer.runtime.llama.model import Model

log = logger("infer.llama")

_KV_CACHE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7,
                   "q8_0": 8, "iq4_nl": 20, "bf16": 30}
_FLASH_ATTN = {"auto": C.LLAMA_FLASH_ATTN_TYPE_AUTO, "on": C.LLAMA_FLASH_ATTN_TYPE_ENABLED,
               "off": C.LLAMA_FLASH_ATTN_TYPE_DISABLED}


_watchdog: tuple[float, Callable[[float], None]] | None = None


def set_decode_watchdog(interval: float, check: Callable[[float], None] | None) -> None:
    """While a llama_decode call runs, call ``check(seconds_so_far)`` every ``interval``
    seconds (from another thread). For remote devices, whose failures can otherwise
    block a decode for ever; ``check`` decides what a stall means. None turns it off."""
    global _watchdog
    _watchdog = (interval, check) if check is not None else None


def flash_attention(params: ContextParams, local_gpu: bool) -> str:
    """The flash-attention setting to ask llama.cpp for: "on" or "off", never llama.cpp's
    own "auto", so that the same flags give the same numbers wherever the layers run.

    "auto" is on where a GPU of this machine holds layers, and off where the layers run on
    the CPU, here or on remote workers (llama.cpp's "auto" turns it on for any device that
    reports itself a GPU, remote workers included, so a run through loopback workers printed
    another text than the same run here). On the CPU, flash attention makes a short prefill
    over a long context about twice as slow and decoding slower too (benchmarks/README.md,
    "Chat"), and gains nothing on long prefills. A quantized V cache needs it: on there.
    """
    return flash_attention_choice(params, local_gpu)[0]


def flash_attention_choice(params: ContextParams, local_gpu: bool) -> tuple[str, str]:
    """flash_attention's setting, and why (for -v)."""
    if params.flash_attn != "auto":
        return params.flash_attn, f"-fa {params.flash_attn}"
    if params.cache_type_v not in ("f16", "f32", "bf16"):
        return "on", f"auto: the {params.cache_type_v} V cache needs it"
    if local_gpu:
        return "on", "auto: a GPU of this machine holds layers"
    return "off", "auto: the layers run on the CPU, here or on workers; -fa on turns it on"


class Context:
    """An inference context: the KV cache and compute buffers for one model."""

    _said_flash = False  # -v says once per process which flash attention "auto" chose

    def __init__(self, model: Model, params: ContextParams) -> None:
        self.model = model
        cp = C.llama_context_default_params()
        n_ctx = params.resolved_n_ctx(model.n_ctx_train)
        cp.n_ctx = n_ctx
        cp.n_batch = min(params.n_batch, n_ctx)
        cp.n_ubatch = min(params.n_ubatch, cp.n_batch)
        cp.n_seq_max = params.n_seq_max
        # Unified: sequences share one pool of cells, so a shared prefix is copied by
        # reference (llama_memory_seq_cp). Not unified: each sequence has its own stream
        # of n_ctx / n_seq_max cells and attends only to them (faster when batching).
        self.kv_unified = params.kv_unified
        cp.kv_unified = self.kv_unified
        threads = params.n_threads or physical_cores()
        cp.n_threads = threads
        cp.n_threads_batch = params.n_threads_batch or threads
        self.flash_attn, why = flash_attention_choice(params, model.local_gpu)
        if not Context._said_flash:
            Context._said_flash = True
            log.info("flash attention: %s (%s)", self.flash_attn, why)
        cp.flash_attn_type = _FLASH_ATTN[self.flash_attn]
        cp.type_k = _KV_CACHE_TYPES[params.cache_type_k]
        cp.type_v = _KV_CACHE_TYPES[params.cache_type_v]
        cp.no_perf = True
        if params.embeddings:
            from infer.runtime.params import POOLING_TYPES

            cp.embeddings = True
            if params.pooling is not None:
                cp.pooling_type = POOLING_TYPES.index(params.pooling)
        self._ptr = C.llama_init_from_model(model.ptr, cp)
        if not self._ptr:
            if params.cache_type_v not in ("f16", "f32", "bf16") and params.flash_attn != "on":
                raise UsageError(
                    f"--cache-type-v {params.cache_type_v} needs flash attention (-fa on)"
                )
            raise ResourceError(
                f"llama.cpp could not create a context of {n_ctx} tokens "
                "(out of memory? try a smaller -c/--ctx-size; -v shows details)"
            )
        self.params = params
        self.n_ctx = int(C.llama_n_ctx(self._ptr))
        self.n_ctx_seq = int(C.llama_n_ctx_seq(self._ptr))  # the cells one sequence may use
        self.n_batch = int(C.llama_n_batch(self._ptr))
        self.n_threads = threads
        self._memory = C.llama_get_memory(self._ptr)

    @property
    def ptr(self) -> Any:
        if not self._ptr:
            raise LlamaError("the context was already closed")
        return self._ptr

    def close(self) -> None:
        if self._ptr:
            C.llama_free(self._ptr)
            self._ptr = None

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def decode(self, batch: Batch) -> None:
        if _watchdog is None:
            rc = C.llama_decode(self._ptr, batch.native)
        else:
            rc = self._decode_watched(batch, *_watchdog)
        if rc == 0:
            return
        if rc == 1:
            raise ResourceError("the KV cache has no room for this batch (context full)")
        if rc == 2:
            raise KeyboardInterrupt
        raise LlamaError(f"llama_decode failed with code {rc}")

    def synchronize(self) -> None:
        """Wait until the device has finished the last decode (GPU and RPC backends return
        before the work is done; the CPU backend never does)."""
        C.llama_synchronize(self.ptr)

    def _decode_watched(self, batch: Batch, interval: float, check: Callable[[float], None]) -> int:
        import threading

        done = threading.Event()

        def watch() -> None:
            t0 = time.monotonic()
            while not done.wait(interval):
                check(time.monotonic() - t0)

        watcher = threading.Thread(target=watch, name="infer-decode-watchdog", daemon=True)
        watcher.start()
        try:
            return int(C.llama_decode(self._ptr, batch.native))
        finally:
            done.set()

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        """While active, Ctrl-C aborts a running llama_decode between two graph nodes.

        Python runs its SIGINT handler only between bytecodes of the main thread, so a
        long prefill chunk would otherwise finish before Ctrl-C is noticed. Here the
        handler only records the signal, Python's C-level handler also writes to a
        wakeup fd (seen even while native code runs), and llama.cpp's abort callback
        polls both; KeyboardInterrupt is raised once the decode call has returned.
        Used around prefill only: the callback runs once per graph node, which would
        cost a single-token decode step noticeably.
        """
        import signal
        import threading

        if (threading.current_thread() is not threading.main_thread()
                or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
            yield  # Ctrl-C is ignored or handled by someone else: leave it alone
            return
        hit: list[int] = []
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)

        def note(signum: int, _frame: Any) -> None:
            hit.append(signum)

        def signalled(_data: Any) -> bool:
            if hit:
                return True
            try:
                return bool(os.read(r, 64))
            except BlockingIOError:
                return False

        callback = C.ggml_abort_callback(signalled)
        previous_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        signal.signal(signal.SIGINT, note)
        C.llama_set_abort_callback(self._ptr, callback, None)
        try:
            yield
        finally:
            C.llama_set_abort_callback(self._ptr, C.ggml_abort_callback(), None)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.set_wakeup_fd(previous_fd)
            os.close(r)
            os.close(w)
        if hit:
            raise KeyboardInterrupt

    def logits(self, i: int) -> Any:
        """A copy of the logits of output `i` of the last decode (a numpy float32 vector)."""
        import numpy as np

        ptr = C.llama_get_logits_ith(self._ptr, i)
        if not ptr:
            raise LlamaError(f"no logits for output {i}")
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,)).copy()

    def seq_state(self, seq_id: int = 0) -> bytes:
        """The KV state of one sequence (llama.cpp's sequence state), to restore later."""
        size = int(C.llama_state_seq_get_size(self._ptr, seq_id))
        buf = (ctypes.c_uint8 * size)()
        written = int(C.llama_state_seq_get_data(self._ptr, buf, size, seq_id))
        return ctypes.string_at(buf, written)  # (slicing a ctypes array would build a list of ints)

    def set_seq_state(self, data: bytes, seq_id: int = 0) -> bool:
        """Load a sequence state saved by `seq_state`; False if llama.cpp refuses it."""
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        return int(C.llama_state_seq_set_data(self._ptr, buf, len(data), seq_id)) > 0

    def memory_seq_rm(self, seq_id: int, p0: int, p1: int = -1) -> bool:
        """Remove positions [p0, p1) of a sequence from the KV cache (p1 < 0: to the end)."""
        return bool(C.llama_memory_seq_rm(self._memory, seq_id, p0, p1))

    def memory_seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        """Make sequence `dst` share `src`'s cells at positions [p0, p1) (p1 < 0: to the end)."""
        C.llama_memory_seq_cp(self._memory, src, dst, p0, p1)

    def memory_clear(self) -> None:
        if self._memory:  # (an encoder, BERT's, keeps no KV cache)
            C.llama_memory_clear(self._memory, True)


class Batch:
    """A reusable native token batch of fixed capacity (llama_batch_init/free)."""

    def __init__(self, capacity: int, n_seq_max: int = 1) -> None:
        self.capacity = capacity
        self.native = C.llama_batch_init(capacity, 0, n_seq_max)
        self._freed = False

    def close(self) -> None:
        if not self._freed:
            C.llama_batch_free(self.native)
            self._freed = True

    def __del__(self) -> None:
        self.close()

    def set_tokens(self, tokens: Sequence[int], *, start_pos: int, seq_id: int = 0,
                   logits_last: bool = True, logits_all: bool = False) -> None:
        """Fill the batch with one sequence's consecutive tokens starting at `start_pos`."""
        n = len(tokens)
        if n > self.capacity:
            raise LlamaError(f"batch of {n} tokens exceeds capacity {self.capacity}")
        b = self.native
        b.n_tokens = n
        tok, pos, nseq, sid, logits = b.token, b.pos, b.n_seq_id, b.seq_id, b.logits
        for i in range(n):
            tok[i] = tokens[i]
            pos[i] = start_pos + i
            nseq[i] = 1
            sid[i][0] = seq_id
            logits[i] = logits_all
        if logits_last and n:
            logits[n - 1] = 1

    def clear(self) -> None:
        """Empty the batch, to fill it with `add`."""
        self.native.n_tokens = 0

    def add(self, token: int, pos: int, seq_id: int, logits: bool) -> int:
        """Append one token of one sequence; its index in the batch (where its logits will be)."""
        b = self.native
        i = b.n_tokens
        if i >= self.capacity:
            raise LlamaError(f"batch is full ({self.capacity} tokens)")
        b.token[i] = token
        b.pos[i] = pos
        b.n_seq_id[i] = 1
        b.seq_id[i][0] = seq_id
        b.logits[i] = logits
        b.n_tokens = i + 1
        return i

    def __len__(self) -> int:
        return int(self.native.n_tokens)

    def set_one(self, token: int, pos: int, seq_id: int = 0) -> None:
        """The decode step's batch: a single token whose logits are wanted."""
        b = self.native
        b.n_tokens = 1
        b.token[0] = token
        b.pos[0] = pos
        b.n_seq_id[0] = 1
        b.seq_id[0][0] = seq_id
        b.logits[0] = 1
