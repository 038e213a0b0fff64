"""A multimodal projector (an ``mmproj`` GGUF) through libmtmd: it turns images and audio into
embeddings the text model reads (llama.cpp's ``tools/mtmd``, bound by llama-cpp-python's
``mtmd_cpp``).

``Projector.chunks`` splits a prompt whose media stand at libmtmd's marker (``<__media__>``)
into text chunks (token ids) and media chunks (each a run of embedding positions, with the id
it was given: infer gives each medium the SHA-256 of its bytes, so that the same image in two
prompts is the same chunk); ``Projector.evaluate`` encodes a media chunk and decodes its
embeddings into a context, as llama.cpp's ``mtmd_helper_eval_chunk_single`` does.
"""

from __future__ import annotations

import ctypes
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infer.runtime.errors import LlamaError, MediaError
from infer.runtime.llama.bindings import load_bindings_module, route_log, take_errors
from infer.runtime.llama.context import _FLASH_ATTN, Context
from infer.runtime.llama.model import Model

MAX_PIXELS = 50_000_000  # an image's width x height at most (decoded: 150 MB of RGB)


def _mtmd() -> Any:
    return load_bindings_module("mtmd_cpp")


@dataclass(frozen=True)
class Chunk:
    """One piece of a tokenized prompt: text (its token ids) or a medium (``kind`` "image"
    or "audio", ``n_tokens`` embeddings, ``digest`` of its bytes); ``handle`` is libmtmd's."""

    kind: str
    n_tokens: int
    tokens: tuple[int, ...] = ()
    digest: str = ""
    handle: Any = None


_KINDS = {0: "text", 1: "image", 2: "audio"}


def projector_inputs(path: str | Path) -> tuple[str, ...]:
    """What the projector file at `path` reads ("images", "audio"), from its header alone."""
    caps = _mtmd().mtmd_get_cap_from_file(str(path).encode())
    return tuple(name for name, has in (("images", caps.inp_vision), ("audio", caps.inp_audio)) if has)


class Projector:
    """An mmproj file loaded for one text model. Close it before the model."""

    def __init__(self, path: str | Path, model: Model, *, n_threads: int, use_gpu: bool,
                 flash_attn: str = "auto") -> None:
        """`flash_attn`: "on", "off" or "auto", as the text model's context has it (the
        encoder's attention rounds otherwise)."""
        m = _mtmd()
        route_log(m.mtmd_log_set, m.mtmd_helper_log_set)
        self.path = Path(path)
        try:  # (which file reads the media: another one's embeddings differ; media.py's tokens)
            st = self.path.stat()
            self.identity = hashlib.sha256(f"{self.path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()
                                           ).hexdigest()[:16]
        except OSError:
            self.identity = ""
        params = m.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.n_threads = n_threads
        params.print_timings = False
        params.warmup = False
        params.flash_attn_type = _FLASH_ATTN[flash_attn]
        take_errors()
        self._ptr = m.mtmd_init_from_file(str(self.path).encode(), model.ptr, params)
        if not self._ptr:  # (a bad --mmproj is the user's to fix: exit 2, as a bad medium)
            said = " ".join(take_errors().split())
            raise MediaError(f"{self.path}: libmtmd could not load the projector"
                             + (f": {said}" if said else " (not an mmproj file, or not this model's?)"))
        self.vision = bool(m.mtmd_support_vision(self._ptr))
        self.audio = bool(m.mtmd_support_audio(self._ptr))
        self.mrope = bool(m.mtmd_decode_use_mrope(self._ptr))
        self.marker = m.mtmd_default_marker().decode()

    @property
    def ptr(self) -> Any:
        if not self._ptr:
            raise LlamaError("the projector was already closed")
        return self._ptr

    def close(self) -> None:
        if self._ptr:
            _mtmd().mtmd_free(self._ptr)
            self._ptr = None

    def __enter__(self) -> Projector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def chunks(self, text: str, media: list[tuple[str, bytes]], *,
               add_special: bool) -> tuple[list[Chunk], Callable[[], None]]:
        """`text` (with one marker per medium) and `media` ((name, bytes) in the markers' order)
        as chunks, and the function that frees them (after the last use of their handles). A
        medium libmtmd cannot decode is a MediaError naming it."""
        m = _mtmd()
        bitmaps = []
        try:
            for name, data in media:
                bitmaps.append(self._bitmap(name, data))
            out = m.mtmd_input_chunks_init()
            text_in = m.mtmd_input_text()
            encoded = text.encode("utf-8")
            text_in.text, text_in.text_len = encoded, len(encoded)
            text_in.add_special, text_in.parse_special = add_special, True
            array = (m.mtmd_bitmap_p_ctypes * max(len(bitmaps), 1))(*bitmaps)
            rc = m.mtmd_tokenize(self.ptr, out, ctypes.byref(text_in), array, len(bitmaps))
            if rc != 0:
                m.mtmd_input_chunks_free(out)
                raise MediaError({1: f"the prompt has {text.count(self.marker)} media markers for "
                                      f"{len(media)} media", 2: "libmtmd could not preprocess a medium"}
                                 .get(rc, f"mtmd_tokenize failed with code {rc}"))
        finally:
            for bitmap in bitmaps:
                m.mtmd_bitmap_free(bitmap)
        chunks = [self._chunk(m.mtmd_input_chunks_get(out, i)) for i in range(m.mtmd_input_chunks_size(out))]
        return chunks, lambda: m.mtmd_input_chunks_free(out)

    def _bitmap(self, name: str, data: bytes) -> Any:
        m = _mtmd()
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        take_errors()
        bitmap = m.mtmd_helper_bitmap_init_from_buf(self.ptr, buf, len(data), False)
        if not bitmap:
            said = " ".join(take_errors().split())
            raise MediaError(f"{name}: not an image or audio file this model reads"
                             + (f" ({said})" if said else ""))
        if not m.mtmd_bitmap_is_audio(bitmap):
            pixels = m.mtmd_bitmap_get_nx(bitmap) * m.mtmd_bitmap_get_ny(bitmap)
            if pixels > MAX_PIXELS:
                m.mtmd_bitmap_free(bitmap)
                raise MediaError(f"{name}: {pixels:,} pixels, over the limit of {MAX_PIXELS:,}")
        m.mtmd_bitmap_set_id(bitmap, hashlib.sha256(data).hexdigest().encode())
        return bitmap

    def _chunk(self, handle: Any) -> Chunk:
        m = _mtmd()
        kind = _KINDS.get(m.mtmd_input_chunk_get_type(handle), "text")
        n = int(m.mtmd_input_chunk_get_n_tokens(handle))
        if kind == "text":
            count = ctypes.c_size_t()
            ptr = m.mtmd_input_chunk_get_tokens_text(handle, ctypes.byref(count))
            return Chunk("text", n, tuple(ptr[i] for i in range(count.value)))
        digest = (m.mtmd_input_chunk_get_id(handle) or b"").decode()
        return Chunk(kind, n, digest=digest, handle=handle)

    def evaluate(self, context: Context, chunk: Chunk, n_past: int, seq_id: int, *,
                 logits_last: bool) -> int:
        """Encode a media chunk and decode its embeddings at `n_past`; the position after it."""
        m = _mtmd()
        new_n_past = m.llama_cpp.llama_pos(0)
        rc = m.mtmd_helper_eval_chunk_single(self.ptr, context.ptr, chunk.handle, n_past, seq_id,
                                             context.n_batch, logits_last, ctypes.byref(new_n_past))
        if rc != 0:
            raise LlamaError(f"libmtmd could not evaluate the {chunk.kind} (code {rc})")
        return int(new_n_past.value)
