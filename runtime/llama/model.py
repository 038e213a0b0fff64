"""A loaded model (``Model``): its weights, placement on devices, metadata and vocabulary."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from infer.runtime.errors import LlamaError, ModelError, UsageError
from infer.runtime.ggml import device_names_of_local_gpus
from infer.runtime.ggml import devices as all_devices
from infer.runtime.llama.bindings import C, init_backend, layer_placement, take_errors
from infer.runtime.log import logger
from infer.runtime.params import ContextParams

log = logger("infer.llama")

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
        init_backend()
        self.path = Path(path)
        self._eog: list[int] | None = None
        if devices is None:
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
        with layer_placement() as placement:
            self._ptr = C.llama_model_load_from_file(str(self.path).encode(), mparams)
        # layer -> device name ("CPU", "CUDA0", "RPC0"...); n_layer is the output layer
        self.placement: dict[int, str] = placement
        if not self._ptr:
            reason = take_errors().split("error loading model: ")[-1].split(" llama_model_load")[0]
            raise ModelError(f"{self.path}: llama.cpp could not load the model: "
                             f"{reason or 'unsupported or corrupt (run with -v for details)'}")
        # Whether a GPU of this machine holds layers (not the CPU, not a remote worker's
        # device): what flash attention's "auto" turns on for (flash_attention).
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

    def fim_tokens(self) -> dict[str, int]:
        """The fill-in-the-middle tokens the vocabulary has (pre, suf, mid, rep, sep; -1: none)."""
        vocab = self.vocab
        names = ("pre", "suf", "mid", "rep", "sep")
        return {name: int(getattr(C, f"llama_vocab_fim_{name}")(vocab)) for name in names}

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
