"""Where a model's parts go, and whether they fit: the memory plan behind ``-ngl auto``.

Pure arithmetic over figures read elsewhere: the model's layout (per-layer weight
bytes and the attention shapes, from the GGUF header), the context settings, and
each device's free memory. It mirrors how llama.cpp places a model:

- the input layer (token embeddings) always stays on the CPU;
- ``n_gpu_layers = k`` offloads the output layer and the last ``k - 1`` repeating
  layers (llama.cpp counts the output layer as one more layer, offloaded first);
- the offloaded layers are cut into contiguous runs, one per device in order, by
  the cumulative ``tensor_split`` fractions; a layer's KV cache lives with it;
- each device that holds layers needs a compute buffer, and so does the CPU.

The compute-buffer figure is an estimate (llama.cpp sizes it by building the
graph); it was checked against llama.cpp's own reports (tests/test_memory_plan.py).
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infer.runtime.errors import ModelError, UsageError

MiB = 1 << 20
GiB = 1 << 30
# Left free on each device for the driver, fragmentation and what the estimate misses
# (llama.cpp's own fitting keeps 1 GiB by default).
DEVICE_MARGIN = 1 * GiB
HOST_MARGIN = 512 * MiB
CTX_STEP = 256  # contexts suggested as "the largest that fits" are multiples of this

# (block size, bytes per block) of the KV cache types (ggml.h)
_KV_TYPE_SIZES = {"f32": (1, 4), "f16": (1, 2), "bf16": (1, 2), "q8_0": (32, 34),
                  "q4_0": (32, 18), "q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24),
                  "iq4_nl": (32, 18)}
_LAYER_TENSOR = re.compile(r"^blk\.(\d+)\.")


class LayoutError(ModelError):
    """The header lacks a figure the planner needs (llama.cpp may still say more)."""


def row_bytes(cache_type: str, n: int) -> int:
    block, size = _KV_TYPE_SIZES[cache_type]
    return -(-n // block) * size


@dataclass(frozen=True)
class ModelLayout:
    """The figures of a model that decide its memory: weights by layer and attention shapes."""

    n_layer: int
    layer_bytes: tuple[int, ...]  # weights of each repeating layer (blk.N.*)
    input_bytes: int              # token embeddings and anything outside the layers
    output_bytes: int             # output norm and projection (a copy of the embeddings if tied)
    n_embd: int
    n_head: int
    n_head_kv: tuple[int, ...]    # per layer
    head_dim_k: int
    head_dim_v: int
    n_vocab: int
    n_ctx_train: int
    n_params: int = 0

    @classmethod
    def from_gguf(cls, metadata: Mapping[str, Any],
                  tensors: Iterable[tuple[str, tuple[int, ...], int]]) -> ModelLayout:
        """From a GGUF header: its metadata and each tensor's (name, shape, bytes)."""
        arch = metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise LayoutError("the model has no general.architecture: cannot plan its memory")

        def num(key: str, default: int | None = None) -> Any:
            value = metadata.get(f"{arch}.{key}", default)
            if value is None:
                raise LayoutError(f"the model has no {arch}.{key}: cannot plan its memory")
            return value

        n_layer = int(num("block_count"))
        layers = [0] * n_layer
        sizes: dict[str, int] = {}
        n_params = 0
        for name, shape, nbytes in tensors:
            sizes[name] = nbytes
            n_params += math.prod(shape)
        input_bytes = output_bytes = 0
        for name, nbytes in sizes.items():
            m = _LAYER_TENSOR.match(name)
            if m and int(m.group(1)) < n_layer:
                layers[int(m.group(1))] += nbytes
            elif name.startswith("output"):
                output_bytes += nbytes
            else:
                input_bytes += nbytes
        if "output.weight" not in sizes and "token_embd.weight" in sizes:
            # tied embeddings: llama.cpp loads a copy of them as the output projection
            output_bytes += sizes["token_embd.weight"]
        n_embd = int(num("embedding_length"))
        n_head_raw = num("attention.head_count")
        n_head = max(n_head_raw) if isinstance(n_head_raw, list) else int(n_head_raw)
        kv_raw = metadata.get(f"{arch}.attention.head_count_kv", n_head_raw)
        n_head_kv = (tuple(int(x) for x in kv_raw) if isinstance(kv_raw, list)
                     else (int(kv_raw),) * n_layer)
        head_k = int(num("attention.key_length", n_embd // max(n_head, 1)))
        head_v = int(num("attention.value_length", head_k))
        vocab = metadata.get("tokenizer.ggml.tokens")
        # a long array the header check did not load still knows its length
        n_vocab = int(metadata.get(f"{arch}.vocab_size")
                      or getattr(vocab, "length", None) or len(vocab or ()))
        return cls(n_layer=n_layer, layer_bytes=tuple(layers), input_bytes=input_bytes,
                   output_bytes=output_bytes, n_embd=n_embd, n_head=n_head,
                   n_head_kv=(n_head_kv + (n_head_kv[-1:] * n_layer))[:n_layer],
                   head_dim_k=head_k, head_dim_v=head_v, n_vocab=n_vocab,
                   n_ctx_train=int(num("context_length", 0)), n_params=n_params)

    def kv_bytes_per_token(self, layer: int, type_k: str, type_v: str) -> int:
        n_kv = self.n_head_kv[layer]
        return row_bytes(type_k, n_kv * self.head_dim_k) + row_bytes(type_v, n_kv * self.head_dim_v)


@dataclass(frozen=True)
class ContextShape:
    """The context settings that decide its memory."""

    n_ctx: int
    n_ubatch: int = 512
    n_seq_max: int = 1
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: bool = False


def compute_bytes(layout: ModelLayout, shape: ContextShape) -> int:
    """An estimate of llama.cpp's compute buffer for one device.

    The graph's buffers are reused, so the peak is the larger of two stages: the
    logits of a full micro-batch, and the attention mask and scores (n_ctx x n_ubatch,
    and that again per head unless flash attention) with the layer's activations. Checked
    against llama.cpp's reported sizes (within +20%/-0% on the test models).
    """
    n_ub = min(shape.n_ubatch, shape.n_ctx)
    logits = n_ub * (layout.n_vocab + 2 * layout.n_embd)
    # the attention mask (n_ctx x n_ubatch) and, without flash attention, the scores
    scores = shape.n_ctx * (1 if shape.flash_attn else layout.n_head + 1)
    attention = n_ub * (scores + 10 * layout.n_embd)
    return int(4 * max(logits, attention) * 1.1)


@dataclass(frozen=True)
class Placement:
    """What one device holds."""

    device: str
    description: str
    layers: tuple[int, ...]   # repeating layers; layout.n_layer stands for the output layer
    weights: int
    kv: int
    compute: int
    free: int                 # bytes free before loading

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute

    @property
    def fits(self) -> bool:
        return self.total <= self.free


@dataclass(frozen=True)
class MemoryPlan:
    n_gpu_layers: int
    tensor_split: tuple[float, ...]   # per offload device, as llama_model_params takes it
    n_ctx: int
    placements: tuple[Placement, ...]  # the CPU (host) first, then each offload device
    max_ctx: int                       # the largest context (a multiple of CTX_STEP) that fits

    @property
    def fits(self) -> bool:
        return all(p.fits for p in self.placements)


@dataclass(frozen=True)
class Budget:
    """A device's name and memory, as the planner sees it (free already less any margin)."""

    name: str
    description: str
    free: int


def layer_devices(n_layer: int, n_gpu_layers: int, split: Sequence[float]) -> list[int]:
    """For layers 0..n_layer (the last is the output layer): the index into ``split``'s
    devices each is placed on, or -1 for the CPU; llama.cpp's rule exactly
    (llama_model::load_tensors), float32 rounding aside."""
    if not split or n_gpu_layers <= 0:
        return [-1] * (n_layer + 1)
    total = sum(split)
    if total <= 0:
        raise UsageError("--tensor-split needs at least one positive weight")
    cumulative: list[float] = []
    acc = 0.0
    for s in split:
        acc += s
        cumulative.append(acc / total)
    start = max(n_layer + 1 - n_gpu_layers, 0)
    active = min(n_gpu_layers, n_layer + 1)
    out = []
    for il in range(n_layer + 1):
        if il < start or il - start >= active:
            out.append(-1)
        else:
            out.append(min(bisect.bisect_right(cumulative, (il - start) / active), len(split) - 1))
    return out


def _place(layout: ModelLayout, shape: ContextShape, host: Budget, devices: Sequence[Budget],
           n_gpu_layers: int, split: Sequence[float]) -> tuple[Placement, ...]:
    where = layer_devices(layout.n_layer, n_gpu_layers, split)
    weights = [0] * (len(devices) + 1)  # index 0: the CPU
    kv = [0] * (len(devices) + 1)
    held: list[list[int]] = [[] for _ in range(len(devices) + 1)]
    weights[0] += layout.input_bytes
    for il, dev in enumerate(where):
        slot = dev + 1
        held[slot].append(il)
        if il == layout.n_layer:
            weights[slot] += layout.output_bytes
            continue
        weights[slot] += layout.layer_bytes[il]
        # n_ctx cells in all, however many sequences share them
        kv[slot] += shape.n_ctx * layout.kv_bytes_per_token(il, shape.type_k, shape.type_v)
    compute = compute_bytes(layout, shape)
    budgets = [host, *devices]
    return tuple(
        Placement(device=b.name, description=b.description, layers=tuple(held[i]),
                  weights=weights[i], kv=kv[i],
                  compute=compute if (i == 0 or held[i]) else 0, free=b.free)
        for i, b in enumerate(budgets)
    )


def _greedy_split(layout: ModelLayout, shape: ContextShape, devices: Sequence[Budget],
                  n_gpu_layers: int) -> tuple[float, ...] | None:
    """Counts that fill the devices in order with the last ``n_gpu_layers`` layers, or None."""
    compute = compute_bytes(layout, shape)
    counts = [0] * len(devices)
    dev, used = 0, 0
    for il in range(layout.n_layer + 1 - n_gpu_layers, layout.n_layer + 1):
        cost = layout.output_bytes if il == layout.n_layer else (
            layout.layer_bytes[il] + shape.n_ctx * layout.kv_bytes_per_token(il, shape.type_k, shape.type_v))
        while dev < len(devices) and used + cost + compute > devices[dev].free:
            dev, used = dev + 1, 0
        if dev == len(devices):
            return None
        counts[dev] += 1
        used += cost
    return tuple(float(c) for c in counts)


def _by_free(devices: Sequence[Budget]) -> tuple[float, ...]:
    """Weights by free memory, in GiB to two places (what --explain shows and llama.cpp gets)."""
    return tuple(max(round(d.free / GiB, 2), 0.01) for d in devices)


def _auto_layers(layout: ModelLayout, shape: ContextShape, host: Budget,
                 devices: Sequence[Budget]) -> tuple[int, tuple[float, ...]]:
    """The most layers that fit on the devices, and the split that places them.

    Shares by free memory first (llama.cpp's default, and it uses every device the
    user named), else fills the devices in order (tighter when memory is short).
    """
    if not devices:
        return 0, ()
    by_free = _by_free(devices)
    for ngl in range(layout.n_layer + 1, 0, -1):
        for split in (by_free, _greedy_split(layout, shape, devices, ngl)):
            if split is not None and all(
                    p.fits for p in _place(layout, shape, host, devices, ngl, split)[1:]):
                return ngl, split
    return 0, ()


def _max_ctx(layout: ModelLayout, shape: ContextShape, host: Budget, devices: Sequence[Budget],
             n_gpu_layers: int, split: Sequence[float]) -> int:
    """The largest context (multiple of CTX_STEP) for which this placement fits, or 0."""
    def fits(n_ctx: int) -> bool:
        s = ContextShape(n_ctx, shape.n_ubatch, shape.n_seq_max, shape.type_k, shape.type_v,
                         shape.flash_attn)
        return all(p.fits for p in _place(layout, s, host, devices, n_gpu_layers, split))

    lo, hi = 0, max(layout.n_ctx_train, shape.n_ctx, CTX_STEP) // CTX_STEP
    if fits(hi * CTX_STEP):
        return hi * CTX_STEP
    while lo < hi - 1:  # fits(lo) (or lo == 0), not fits(hi)
        mid = (lo + hi) // 2
        if fits(mid * CTX_STEP):
            lo = mid
        else:
            hi = mid
    return lo * CTX_STEP


def plan_memory(layout: ModelLayout, shape: ContextShape, *, host: Budget,
                devices: Sequence[Budget] = (), n_gpu_layers: int | None = None,
                tensor_split: Sequence[float] = ()) -> MemoryPlan:
    """Place the model on the CPU (``host``) and the offload ``devices``.

    ``n_gpu_layers=None`` is ``-ngl auto``: as many layers as fit on the devices
    (their budgets already less a margin); -1 means all. An explicit ``tensor_split``
    weights the devices; otherwise they are weighted by free memory, as llama.cpp
    does, or, for auto when that does not fit, filled in order.
    """
    if tensor_split and len(tensor_split) != len(devices):
        raise UsageError(f"--tensor-split has {len(tensor_split)} weights for "
                         f"{len(devices)} device(s): {', '.join(d.name for d in devices) or 'none'}")
    if n_gpu_layers is None:
        if tensor_split:
            n_gpu_layers = layout.n_layer + 1 if devices else 0
            split = tuple(tensor_split)
        else:
            n_gpu_layers, split = _auto_layers(layout, shape, host, devices)
    else:
        n_gpu_layers = layout.n_layer + 1 if n_gpu_layers < 0 else n_gpu_layers
        n_gpu_layers = n_gpu_layers if devices else 0
        split = tuple(tensor_split) or _by_free(devices)
    placements = _place(layout, shape, host, devices, n_gpu_layers, split)
    return MemoryPlan(n_gpu_layers=n_gpu_layers, tensor_split=split if n_gpu_layers else (),
                      n_ctx=shape.n_ctx, placements=placements,
                      max_ctx=_max_ctx(layout, shape, host, devices, n_gpu_layers, split))


def budget(name: str, description: str, free: int, margin: int) -> Budget:
    return Budget(name, description, max(0, free - margin))

