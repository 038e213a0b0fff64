"""Context parameters: how large a context to create and how to run it."""

from __future__ import annotations

from dataclasses import dataclass

from infer.runtime.errors import UsageError

KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")
FLASH_ATTN_MODES = ("auto", "on", "off")
POOLING_TYPES = ("none", "mean", "cls", "last", "rank")  # llama_pooling_type's, in its order from 0


def recorded_pooling(value: object) -> str | None:
    """The pooling a GGUF's `{arch}.pooling_type` value names (a number, or its digits as
    llama.cpp's metadata reads give it): mean, cls, last or rank; None for none or no value."""
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < len(POOLING_TYPES):
        return None
    return POOLING_TYPES[value]


@dataclass(frozen=True)
class ContextParams:
    """Frozen, validated context settings; names follow llama.cpp's.

    ``n_ctx=None`` means the model's training context capped at DEFAULT_MAX_CTX, ``0`` the
    model's whole training context (llama.cpp's ``-c 0``);
    ``n_threads=None`` means the physical cores; ``n_gpu_layers=None`` means as
    many layers as fit on the GPUs and workers (``-ngl auto``; all of them when the
    caller did not plan), -1 all of them.
    """

    DEFAULT_MAX_CTX = 4096

    n_ctx: int | None = None
    n_batch: int = 2048
    n_ubatch: int = 512
    n_seq_max: int = 1
    # One pool of cells for all sequences (True), or a stream of n_ctx / n_seq_max cells
    # per sequence (False: each token attends to its own sequence's cells only, which
    # made batched decoding 20% faster in benchmarks/batch.py).
    kv_unified: bool = False
    n_threads: int | None = None
    n_threads_batch: int | None = None
    n_gpu_layers: int | None = None
    flash_attn: str = "auto"
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    use_mmap: bool = True
    # Let llama.cpp repack weights on the CPU into faster layouts (AMX, CPU_REPACK) where its
    # check says that works here (runtime/repack.py); False: never (llama.cpp's -nr).
    repack: bool = True
    tensor_split: tuple[float, ...] = ()  # weights of the offload devices (empty: by free memory)
    rpc: tuple[str, ...] = ()              # HOST:PORT of RPC workers whose devices join in
    # An embedding context (runtime/embedding.py): outputs are embeddings, pooled per sequence
    # as `pooling` says (None: as the model says; "none", "mean", "cls", "last", "rank").
    embeddings: bool = False
    pooling: str | None = None

    def resolved_n_ctx(self, n_ctx_train: int) -> int:
        """The context size to create: n_ctx; 0: the model's training context; None: that,
        capped at DEFAULT_MAX_CTX."""
        if self.n_ctx == 0:
            return n_ctx_train or self.DEFAULT_MAX_CTX
        return self.n_ctx or min(n_ctx_train or 4096, self.DEFAULT_MAX_CTX)

    def __post_init__(self) -> None:
        if self.n_ctx is not None and self.n_ctx != 0 and self.n_ctx < 16:
            raise UsageError(f"context size must be at least 16 tokens (or 0: the model's training "
                             f"context), got {self.n_ctx}")
        for name in ("n_batch", "n_ubatch", "n_seq_max"):
            if getattr(self, name) < 1:
                raise UsageError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("n_threads", "n_threads_batch"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UsageError(f"thread count must be at least 1, got {value}")
        if self.n_gpu_layers is not None and self.n_gpu_layers < -1:
            raise UsageError(f"GPU layers must be -1 (all) or more, got {self.n_gpu_layers}")
        if any(w < 0 for w in self.tensor_split) or (self.tensor_split and not any(self.tensor_split)):
            raise UsageError("--tensor-split weights must be 0 or more, and not all 0")
        if self.flash_attn not in FLASH_ATTN_MODES:
            raise UsageError(
                f"flash attention must be one of {', '.join(FLASH_ATTN_MODES)}, "
                f"got {self.flash_attn!r}"
            )
        if self.pooling is not None and self.pooling not in POOLING_TYPES:
            raise UsageError(f"pooling must be one of {', '.join(POOLING_TYPES)}, got {self.pooling!r}")
        for name in ("cache_type_k", "cache_type_v"):
            value = getattr(self, name)
            if value not in KV_CACHE_TYPES:
                raise UsageError(
                    f"unknown KV cache type {value!r} (valid: {', '.join(KV_CACHE_TYPES)})"
                )
