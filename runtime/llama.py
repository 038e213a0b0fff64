"""Where infer calls llama.cpp's C API (through llama-cpp-python's ctypes bindings).

It owns native handles (model, context, batch, sampler chain), frees them
deterministically, routes llama.cpp's log into Python ``logging`` and turns
failures into infer's typed errors. ``runtime/ggml.py`` binds ggml's device API,
which llama.cpp's does not cover; no other module calls native code.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import logging
import math
import os
import re
import sys
import time
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

from infer.runtime.errors import LlamaError, ModelError, ResourceError, UsageError
from infer.runtime.log import logger
from infer.runtime.params import ContextParams

log = logger("infer.llama")


def load_bindings_module(name: str) -> types.ModuleType:
    """Import ``llama_cpp.<name>`` without running the package's ``__init__``.

    ``import llama_cpp`` also imports the high-level ``Llama`` class and its chat
    formats, which costs a noticeable share of a one-shot ``infer run``'s start-up.
    A bare package object stands in while the submodule loads, then is removed so
    that a later ``import llama_cpp`` elsewhere still gets the real package.
    """
    full = f"llama_cpp.{name}"
    if full in sys.modules:
        return sys.modules[full]
    if "llama_cpp" in sys.modules:
        return importlib.import_module(full)
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.submodule_search_locations is None:
        raise LlamaError("llama-cpp-python is not installed (pip install llama-cpp-python)")
    stub = types.ModuleType("llama_cpp")
    stub.__path__ = list(spec.submodule_search_locations)
    stub.__spec__ = spec
    sys.modules["llama_cpp"] = stub
    try:
        return importlib.import_module(full)
    finally:
        if sys.modules.get("llama_cpp") is stub:
            del sys.modules["llama_cpp"]


C: Any = load_bindings_module("llama_cpp")

# ggml log levels (ggml.h) -> Python logging levels.
_LOG_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_last_level = logging.INFO
_errors: list[str] = []  # llama.cpp's error lines since the last take_errors()
# While a model loads: layer index -> the device llama.cpp put it on (its debug log
# is the only place that says; layer n_layer is the output layer).
_placement: dict[int, str] | None = None
_PLACED = re.compile(r"layer\s+(\d+) assigned to device (\S+?),")


_partial = ""  # a line llama.cpp has not finished (it logs a load's progress dot by dot)


@C.llama_log_callback
def _log_callback(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    global _last_level, _partial
    # GGML_LOG_LEVEL_CONT (5) continues the previous line at its level.
    if level != 5:
        if _partial:
            _log_line(_last_level, _partial)
            _partial = ""
        _last_level = _LOG_LEVELS.get(level, logging.INFO)
    lines = (_partial + text.decode("utf-8", "replace")).split("\n")
    _partial = lines.pop()  # "" when the text ended its line
    if _partial and _last_level >= logging.ERROR:  # an error is never held back
        lines.append(_partial)
        _partial = ""
    for line in lines:
        _log_line(_last_level, line)


def _log_line(py_level: int, line: str) -> None:
    if _placement is not None and "assigned to device" in line:
        m = _PLACED.search(line)
        if m:
            _placement[int(m.group(1))] = m.group(2)
    if py_level >= logging.ERROR:
        del _errors[:-8]
        _errors.append(line)
    if log.isEnabledFor(py_level):
        log.log(py_level, "%s", line)


_watchdog: tuple[float, Callable[[float], None]] | None = None


def set_decode_watchdog(interval: float, check: Callable[[float], None] | None) -> None:
    """While a llama_decode call runs, call ``check(seconds_so_far)`` every ``interval``
    seconds (from another thread). For remote devices, whose failures can otherwise
    block a decode for ever; ``check`` decides what a stall means. None turns it off."""
    global _watchdog
    _watchdog = (interval, check) if check is not None else None


def take_errors() -> str:
    """The error lines llama.cpp logged since the last call, joined, for an error message."""
    text = " ".join(" ".join(e.split()) for e in _errors)
    _errors.clear()
    return text


def init_backend() -> None:
    """Route llama.cpp's log to ``logging`` and initialise its backends (once per process).

    The log is claimed again on every call: another library in the same process (the
    ``llama_cpp`` package's high-level ``Llama`` sets its own callback on import) would
    otherwise take the lines a model load's placement and error messages are read from."""
    C.llama_log_set(_log_callback, ctypes.c_void_p(0))
    _init_backends()


@cache
def _init_backends() -> None:
    C.llama_backend_init()


def llama_cpp_version() -> str:
    """The llama.cpp build the bindings were compiled from."""
    raw = C.llama_version()
    return raw.decode() if raw else "unknown"


def system_info() -> str:
    return C.llama_print_system_info().decode("utf-8", "replace").strip()


def physical_cores() -> int:
    """Physical cores this process may use: llama.cpp's default thread count."""
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = os.cpu_count() or 1
    cores: set[tuple[str, str]] = set()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            phys = core = ""
            for line in f:
                if line.startswith("physical id"):
                    phys = line.split(":", 1)[1].strip()
                elif line.startswith("core id"):
                    core = line.split(":", 1)[1].strip()
                    cores.add((phys, core))
    except OSError:
        pass
    return max(1, min(allowed, len(cores) or allowed))


_KV_CACHE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7,
                   "q8_0": 8, "iq4_nl": 20, "bf16": 30}
_FLASH_ATTN = {"auto": C.LLAMA_FLASH_ATTN_TYPE_AUTO, "on": C.LLAMA_FLASH_ATTN_TYPE_ENABLED,
               "off": C.LLAMA_FLASH_ATTN_TYPE_DISABLED}
ATTR_CONTROL = C.LLAMA_TOKEN_ATTR_CONTROL | C.LLAMA_TOKEN_ATTR_USER_DEFINED


def vocab_type(model: Model) -> int:
    """llama.cpp's vocabulary type (SPM, BPE, WPM, ...) as its enum value."""
    return int(C.llama_vocab_type(model.vocab))


class Model:
    """A loaded model (weights memory-mapped) and its vocabulary."""

    def __init__(self, path: str | Path, *, n_gpu_layers: int | None = None,
                 devices: Sequence[int] | None = None, tensor_split: Sequence[float] = (),
                 use_mmap: bool = True, vocab_only: bool = False, repack: bool = True) -> None:
        """``devices``: ggml device handles to offload to, in order (None: every local
        GPU); ``n_gpu_layers``: how many layers go to them (None or -1: all);
        ``tensor_split``: their weights (empty: by free memory); ``repack``: let llama.cpp
        move weights on the CPU into its extra buffer types where that works on this
        machine (runtime/repack.py checks once), False: never (llama.cpp's -nr)."""
        global _placement
        init_backend()
        self.path = Path(path)
        self._eog: list[int] | None = None
        if devices is None:
            from infer.runtime.ggml import devices as all_devices

            devices = [d.handle for d in all_devices() if d.offloads]
        mparams = C.llama_model_default_params()
        if not devices:
            n_gpu_layers = 0
        mparams.n_gpu_layers = -1 if n_gpu_layers is None else n_gpu_layers
        self._devices = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
        mparams.devices = ctypes.cast(self._devices, ctypes.c_void_p)
        if tensor_split:
            if len(tensor_split) > C.llama_max_devices():
                raise UsageError(f"--tensor-split: at most {C.llama_max_devices()} devices")
            self._split = (ctypes.c_float * C.llama_max_devices())(*tensor_split)
            mparams.tensor_split = self._split
        mparams.load_mode = C.LLAMA_LOAD_MODE_MMAP if use_mmap else C.LLAMA_LOAD_MODE_NONE
        mparams.vocab_only = vocab_only
        mparams.use_extra_bufts = _use_extra_buffers(repack) if not vocab_only else False
        take_errors()
        _placement = {}
        try:
            self._ptr = C.llama_model_load_from_file(str(self.path).encode(), mparams)
            # layer -> device name ("CPU", "CUDA0", "RPC0"...); n_layer is the output layer
            self.placement: dict[int, str] = _placement
        finally:
            _placement = None
        if not self._ptr:
            reason = take_errors().split("error loading model: ")[-1].split(" llama_model_load")[0]
            raise ModelError(f"{self.path}: llama.cpp could not load the model: "
                             f"{reason or 'unsupported or corrupt (run with -v for details)'}")
        # Whether a GPU of this machine holds layers (not the CPU, not a remote worker's
        # device): what flash attention's "auto" turns on for (flash_attention).
        from infer.runtime.ggml import device_names_of_local_gpus

        local_gpus = device_names_of_local_gpus(devices) if n_gpu_layers != 0 else set()
        self.local_gpu = (any(name in local_gpus for name in self.placement.values()) if self.placement
                          else bool(local_gpus))
        self.vocab = C.llama_model_get_vocab(self._ptr)
        self.n_vocab = C.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train = C.llama_model_n_ctx_train(self._ptr)
        self.add_bos = bool(C.llama_vocab_get_add_bos(self.vocab))
        self.bos = C.llama_vocab_bos(self.vocab)
        self.eos = C.llama_vocab_eos(self.vocab)
        self._piece_buf = ctypes.create_string_buffer(256)

    @classmethod
    def load(cls, path: str | Path, params: ContextParams, *,
             devices: Sequence[int] | None = None) -> Model:
        """The model at `path`, loaded with the settings of `params` that concern the weights
        (offload, split, mmap, repacking)."""
        return cls(path, n_gpu_layers=params.n_gpu_layers, devices=devices,
                   tensor_split=params.tensor_split, use_mmap=params.use_mmap, repack=params.repack)

    @property
    def ptr(self) -> Any:
        if not self._ptr:
            raise LlamaError("the model was already closed")
        return self._ptr

    def close(self) -> None:
        if self._ptr:
            C.llama_model_free(self._ptr)
            self._ptr = None
            self.vocab = None  # the vocabulary belongs to the model: never use it freed

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- metadata -------------------------------------------------------------

    def meta(self, key: str) -> str | None:
        """A metadata value as llama.cpp renders it, or None if absent."""
        size = 256
        while True:
            buf = ctypes.create_string_buffer(size)
            n = C.llama_model_meta_val_str(self.ptr, key.encode(), buf, size)
            if n < 0:
                return None
            if n < size:
                return buf.value.decode("utf-8", "replace")
            size = n + 1

    def chat_template(self) -> str | None:
        raw = C.llama_model_chat_template(self.ptr, None)
        return raw.decode("utf-8", "replace") if raw else None

    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        C.llama_model_desc(self.ptr, buf, 256)
        return buf.value.decode("utf-8", "replace")

    @property
    def n_params(self) -> int:
        return int(C.llama_model_n_params(self.ptr))

    @property
    def n_layer(self) -> int:
        return int(C.llama_model_n_layer(self.ptr))

    # -- vocabulary -----------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """Text -> token ids. `parse_special` lets control-token text become control tokens."""
        if not self.vocab:
            raise LlamaError("the model was already closed")
        data = text.encode("utf-8")
        cap = len(data) + 8
        buf = (C.llama_token * cap)()
        n = C.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (C.llama_token * cap)()
            n = C.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special,
                                 parse_special)
        if n < 0:
            raise LlamaError(f"tokenization failed ({n})")
        return buf[:n]

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        """The bytes one token stands for (control tokens render empty unless `special`)."""
        buf = self._piece_buf
        n = C.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = C.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def is_eog(self, token: int) -> bool:
        return bool(C.llama_vocab_is_eog(self.vocab, token))

    def eog_tokens(self) -> list[int]:
        """Every end-of-generation token (EOS, EOT, <|im_end|>...); found once per model
        (a pass over the vocabulary: ~0.1 s for 128k tokens)."""
        if self._eog is None:
            is_eog, vocab = C.llama_vocab_is_eog, self.vocab
            self._eog = [t for t in range(self.n_vocab) if is_eog(vocab, t)]
        return list(self._eog)

    def is_control(self, token: int) -> bool:
        return bool(C.llama_vocab_get_attr(self.vocab, token) & ATTR_CONTROL)

    def special_token_text(self, token: int) -> str:
        return self.token_bytes(token, special=True).decode("utf-8", "replace")

    def apply_builtin_template(self, name: str, messages: Sequence[dict[str, str]],
                               *, add_generation_prompt: bool) -> str | None:
        """Render with one of llama.cpp's built-in templates; None if it does not know `name`."""
        keep = [(m["role"].encode(), m["content"].encode()) for m in messages]
        arr = (C.llama_chat_message * len(keep))()
        for i, (role, content) in enumerate(keep):
            arr[i].role = role
            arr[i].content = content
        size = 2 * sum(len(c) + len(r) for r, c in keep) + 256
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = C.llama_chat_apply_template(name.encode(), arr, len(keep),
                                            add_generation_prompt, buf, size)
            if n < 0:
                return None
            if n <= size:
                return buf.raw[:n].decode("utf-8", "replace")
            size = n + 1
        return None


_said_repack_off = False


def _use_extra_buffers(wanted: bool) -> bool:
    """Whether a model loads with extra buffer types: wanted and not known to crash here
    (the first load may run runtime/repack.py's check: under a second, once per machine)."""
    global _said_repack_off
    if wanted:
        from infer.runtime import repack

        return repack.allowed()  # (it says once when the check turned repacking off)
    if not _said_repack_off:
        _said_repack_off = True
        log.info("weight repacking is off, as asked (llama.cpp's -nr/--no-repack)")
    return False


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
        C.llama_memory_clear(self._memory, True)

    def memory_seq_pos_max(self, seq_id: int) -> int:
        return int(C.llama_memory_seq_pos_max(self._memory, seq_id))


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


@dataclass
class CapturedText:
    text: str = ""


@contextmanager
def native_stderr_captured() -> Iterator[CapturedText]:
    """Capture what native code writes straight to file descriptor 2 (not through the log).

    llama.cpp's grammar parser reports errors with fprintf(stderr); this keeps them off
    the user's terminal and lets the caller put them into one clear message.
    """
    import tempfile

    captured = CapturedText()
    with suppress(OSError, ValueError):
        sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield captured
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            captured.text = tmp.read().decode("utf-8", "replace")


_FLT_MAX = 3.4028234663852886e38


class SamplerSpec(NamedTuple):
    """One sampler of a chain, as data: its kind and its arguments (see SamplerChain)."""

    kind: str
    args: tuple[Any, ...] = ()


# Samplers whose constructors take plain numbers, in llama.h's argument order.
_PLAIN_SAMPLERS = {
    "greedy": C.llama_sampler_init_greedy,
    "dist": C.llama_sampler_init_dist,  # (seed)
    "temp": C.llama_sampler_init_temp,  # (t)
    "top_k": C.llama_sampler_init_top_k,  # (k)
    "top_p": C.llama_sampler_init_top_p,  # (p, min_keep)
    "min_p": C.llama_sampler_init_min_p,  # (p, min_keep)
    "typical": C.llama_sampler_init_typical,  # (p, min_keep)
    "xtc": C.llama_sampler_init_xtc,  # (p, t, min_keep, seed)
    "penalties": C.llama_sampler_init_penalties,  # (n_vocab, last_n, repeat, freq, present)
    "mirostat": C.llama_sampler_init_mirostat,  # (n_vocab, seed, tau, eta, m)
    "mirostat_v2": C.llama_sampler_init_mirostat_v2,  # (seed, tau, eta)
}


class SamplerChain:
    """A native llama.cpp sampler chain; sampling and accepting happen in C.

    Besides the plain samplers above it takes ``logit_bias`` ((token, bias) pairs),
    ``grammar`` (GBNF text) and ``dry`` (multiplier, base, allowed length,
    penalty-last-n, sequence breakers).

    A grammar is checked on the drawn token first, as llama.cpp's own tools do
    (common_sampler): the chain draws without it, and only when the grammar refuses
    that token is the draw made again, from the state before it, with the grammar
    applied to every token of the vocabulary first (about 8 ms a token for a 49k
    vocabulary on a CPU core: applied at every token, it halved the decode speed of
    every constrained reply). Greedy decoding picks the same token either way; a
    random draw follows llama.cpp's distribution.
    """

    def __init__(self, model: Model, specs: Sequence[SamplerSpec]) -> None:
        self._grammar: Any = None
        self._ptr: Any = None  # every sampler but the grammar, in order
        self._n_vocab = model.n_vocab
        self._candidates: _Candidates | None = None  # made at the first refused draw
        try:
            for spec in specs:
                if spec.kind == "grammar":
                    self._grammar = _make_sampler(model, spec)
            self._ptr = _chain(model, [spec for spec in specs if spec.kind != "grammar"])
        except BaseException:
            self.close()
            raise

    def sample(self, ctx: Context, idx: int = -1) -> int:
        """Sample from the logits of output `idx` and accept the token into the chain's state."""
        if self._grammar is None:
            return int(C.llama_sampler_sample(self._ptr, ctx._ptr, idx))
        before = C.llama_sampler_clone(self._ptr)
        if not before:
            raise LlamaError("llama.cpp could not copy the sampler chain")
        token = int(C.llama_sampler_sample(self._ptr, ctx._ptr, idx))
        if self._allows(token):
            C.llama_sampler_free(before)
        else:  # draw again from the state before, among the tokens the grammar allows
            C.llama_sampler_free(self._ptr)
            self._ptr = before
            token = self._constrained_draw(ctx, idx)
            C.llama_sampler_accept(self._ptr, token)
        C.llama_sampler_accept(self._grammar, token)
        return token

    def _allows(self, token: int) -> bool:
        one = C.llama_token_data(token, 0.0, 0.0)
        cur = C.llama_token_data_array(ctypes.pointer(one), 1, -1, False)
        C.llama_sampler_apply(self._grammar, ctypes.byref(cur))
        return cur.data[0].logit != -math.inf

    def _constrained_draw(self, ctx: Context, idx: int) -> int:
        """The grammar over the whole vocabulary, then the chain: the token selected."""
        logits = C.llama_get_logits_ith(ctx._ptr, idx)
        if not logits:
            raise LlamaError(f"no logits for output {idx}")
        if self._candidates is None:
            self._candidates = _Candidates(self._n_vocab)
        cur = self._candidates.fill(logits)
        # (The grammar before a logit bias, where the chain has it after: the same tokens
        # are left, as the bias is finite or -inf; see _make_sampler.)
        for smpl in (self._grammar, self._ptr):
            C.llama_sampler_apply(smpl, ctypes.byref(cur))
        if not 0 <= cur.selected < cur.size:
            raise LlamaError("the sampler chain selected no token")
        return int(cur.data[cur.selected].id)

    def accept(self, token: int) -> None:
        C.llama_sampler_accept(self._ptr, token)
        if self._grammar:
            C.llama_sampler_accept(self._grammar, token)

    def clone(self) -> SamplerChain:
        """An independent copy in the same state (random generator, penalties, grammar)."""
        twin = SamplerChain.__new__(SamplerChain)
        twin._n_vocab, twin._candidates = self._n_vocab, None
        twin._ptr = C.llama_sampler_clone(self._ptr)
        twin._grammar = C.llama_sampler_clone(self._grammar) if self._grammar else None
        return twin

    def reset(self) -> None:
        for smpl in (self._grammar, self._ptr):
            if smpl:
                C.llama_sampler_reset(smpl)

    def close(self) -> None:
        for name in ("_grammar", "_ptr"):
            smpl = getattr(self, name, None)
            if smpl:
                C.llama_sampler_free(smpl)
            setattr(self, name, None)

    def __enter__(self) -> SamplerChain:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _chain(model: Model, specs: Sequence[SamplerSpec]) -> Any:
    params = C.llama_sampler_chain_default_params()
    params.no_perf = True
    chain = C.llama_sampler_chain_init(params)
    try:
        for spec in specs:
            C.llama_sampler_chain_add(chain, _make_sampler(model, spec))
    except BaseException:
        C.llama_sampler_free(chain)
        raise
    return chain


class _Candidates:
    """Every token of the vocabulary with its logit, as llama.cpp's samplers take them
    (llama_token_data: id, logit, p), filled from a row of logits without a Python loop."""

    def __init__(self, n_vocab: int) -> None:
        import array

        self.n = n_vocab
        self._blank = (C.llama_token_data * n_vocab)()  # ids in order, logits and p zero
        memoryview(self._blank).cast("B").cast("i")[0::3] = array.array("i", range(n_vocab))
        self._data = (C.llama_token_data * n_vocab)()
        self._logits = memoryview(self._data).cast("B").cast("f")[1::3]
        self._start = ctypes.cast(self._data, C.llama_token_data_p)
        self._array = C.llama_token_data_array(self._start, n_vocab, -1, False)

    def fill(self, logits: Any) -> Any:
        """The array with these logits (a float pointer of n_vocab), unsorted, none selected."""
        ctypes.memmove(self._data, self._blank, ctypes.sizeof(self._data))
        row = (ctypes.c_float * self.n).from_address(ctypes.addressof(logits.contents))
        self._logits[:] = memoryview(row).cast("B").cast("f")
        a = self._array
        a.data, a.size, a.selected, a.sorted = self._start, self.n, -1, False  # (samplers move them)
        return a


def _make_sampler(model: Model, spec: SamplerSpec) -> Any:
    kind, args = spec
    if kind in _PLAIN_SAMPLERS:
        smpl = _PLAIN_SAMPLERS[kind](*args)
    elif kind == "logit_bias":
        (biases,) = args
        arr = (C.llama_logit_bias * len(biases))()
        for i, (token, bias) in enumerate(biases):
            arr[i].token = token
            # +inf as the largest float: the same choice, and -inf (a grammar's refusal,
            # applied first by SamplerChain's second draw) plus it stays -inf, not NaN.
            arr[i].bias = min(bias, _FLT_MAX)
        smpl = C.llama_sampler_init_logit_bias(model.n_vocab, len(biases), arr)
    elif kind == "dry":
        multiplier, base, allowed_length, last_n, breakers = args
        encoded = [b.encode("utf-8") for b in breakers]
        arr_b = (ctypes.c_char_p * len(encoded))(*encoded)
        smpl = C.llama_sampler_init_dry(model.vocab, multiplier, base, allowed_length, last_n,
                                        arr_b, len(encoded))
    elif kind == "grammar":
        (grammar,) = args
        with native_stderr_captured() as said:  # the parser reports errors on fd 2
            smpl = C.llama_sampler_init_grammar(model.vocab, grammar.encode("utf-8"), b"root")
        detail = " ".join(said.text.split())
        if not smpl:
            raise UsageError(f"invalid grammar: {detail}" if detail else "invalid grammar")
        if detail:
            log.warning("%s", detail)
    else:
        raise LlamaError(f"unknown sampler kind {kind!r}")
    if not smpl:
        raise UsageError(f"llama.cpp rejected the {kind} sampler settings {args!r}")
    return smpl
