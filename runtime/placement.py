"""Where a model goes before it loads: -ngl auto, --tensor-split, --rpc workers.

Takes the model's layout (read from its GGUF header by quant/layout.py), each device's
free memory from ggml, plans with ``runtime.memory_plan`` and hands the result to the
loader. A context that cannot fit fails here, before llama.cpp allocates anything.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from infer.runtime.errors import ResourceError
from infer.runtime.memory_plan import (
    DEVICE_MARGIN,
    HOST_MARGIN,
    ContextShape,
    LayoutError,
    MemoryPlan,
    ModelLayout,
    budget,
    plan_memory,
)
from infer.runtime.params import ContextParams

GiB = 1 << 30
SMALLEST_AUTO_CTX = 512  # a default context is shrunk to what fits, down to this


@dataclass(frozen=True)
class Placed:
    """A planned load: the parameters to load with, the devices, and the plan itself."""

    params: ContextParams  # n_ctx, n_gpu_layers and tensor_split as planned
    devices: list[Any]     # runtime.ggml.Device: the offload devices, workers first
    plan: MemoryPlan | None  # None: the header lacks what planning needs (see unplanned)
    layout: ModelLayout | None
    shrunk_from: int | None = None  # the default context, when it had to be made smaller
    unplanned: LayoutError | None = None
    reserved: tuple[str, int] | None = None  # (device, bytes) kept for the projector (images, audio)

    @property
    def handles(self) -> list[int]:
        return [d.handle for d in self.devices]


def host_free() -> int:
    """Memory this machine can give a new process now: MemAvailable, else ggml's figure."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    from infer.runtime.ggml import devices

    cpu = [d for d in devices() if d.kind == "cpu"]
    return cpu[0].free if cpu else 0


def place(read_layout: Callable[[], ModelLayout], cparams: ContextParams, *, whole: bool = False,
          reserve: int = 0) -> Placed:
    """Plan the load of the model whose layout `read_layout` gives with ``cparams``; `reserve`:
    bytes kept on the first local GPU it offloads to (else the CPU) for a projector.

    Connects to the --rpc workers (NetworkError naming one that is unreachable). A
    context given with -c that does not fit raises ResourceError naming the largest that
    does; the default context is shrunk instead. `whole`: the default context is the
    model's training context (a server's pool), not capped.
    """
    from infer.runtime import ggml
    from infer.runtime.llama import flash_attention

    workers = ggml.add_workers(list(cparams.rpc)) if cparams.rpc else []
    offload = workers + [d for d in ggml.devices() if d.offloads]
    try:
        layout = read_layout()
    except LayoutError as e:  # let llama.cpp load it (and say what is wrong with it)
        return Placed(cparams, offload, None, None, unplanned=e)
    n_ctx = cparams.resolved_n_ctx(layout.n_ctx_train)
    if whole and cparams.n_ctx is None and layout.n_ctx_train:
        n_ctx = layout.n_ctx_train
    local_gpu = cparams.n_gpu_layers != 0 and any(not d.remote for d in offload)
    flash = flash_attention(cparams, local_gpu) == "on"
    shape = ContextShape(n_ctx=n_ctx, n_ubatch=min(cparams.n_ubatch, cparams.n_batch),
                         n_seq_max=cparams.n_seq_max, type_k=cparams.cache_type_k,
                         type_v=cparams.cache_type_v, flash_attn=flash)
    cpu = next((d for d in ggml.devices() if d.kind == "cpu"), None)
    host = budget("CPU", cpu.description if cpu else "CPU", host_free(), HOST_MARGIN)
    budgets = [budget(d.name, d.description, d.free, DEVICE_MARGIN) for d in offload]
    reserved = None
    if reserve:  # (libmtmd puts the projector on the first GPU, as the model's first layers)
        at = next((i for i, d in enumerate(offload) if not d.remote), None) if local_gpu else None
        if at is None:
            host, reserved = replace(host, free=max(0, host.free - reserve)), ("CPU", reserve)
        else:
            budgets[at] = replace(budgets[at], free=max(0, budgets[at].free - reserve))
            reserved = (offload[at].name, reserve)

    def make(shape: ContextShape) -> MemoryPlan:
        return plan_memory(layout, shape, host=host, devices=budgets,
                           n_gpu_layers=cparams.n_gpu_layers, tensor_split=cparams.tensor_split)

    plan = make(shape)
    shrunk_from = None
    if not plan.fits and cparams.n_ctx is None and plan.max_ctx >= SMALLEST_AUTO_CTX:
        shrunk_from = n_ctx
        plan = make(replace(shape, n_ctx=plan.max_ctx))
    if not plan.fits:
        raise ResourceError(does_not_fit(plan))
    params = replace(cparams, n_ctx=plan.n_ctx, n_gpu_layers=plan.n_gpu_layers,
                     tensor_split=plan.tensor_split)
    return Placed(params, offload, plan, layout, shrunk_from, reserved=reserved)


def size_text(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB / 10 else f"{n / (1 << 20):.0f} MiB"


def does_not_fit(plan: MemoryPlan) -> str:
    worst = next(p for p in plan.placements if not p.fits)
    need = (f"{worst.device} needs {size_text(worst.total)} (weights {size_text(worst.weights)}, "
            f"KV cache {size_text(worst.kv)}, compute {size_text(worst.compute)}) and has "
            f"{size_text(worst.free)} to spare")
    if plan.max_ctx:
        return (f"a context of {plan.n_ctx} tokens does not fit in memory: {need}; "
                f"the largest context that fits is {plan.max_ctx} tokens (-c {plan.max_ctx})")
    return f"the model does not fit in memory even with a small context: {need}"


def layer_ranges(layers: Sequence[int], n_layer: int) -> str:
    """"0-3, output" for layers 0,1,2,3 and the output layer (index n_layer)."""
    parts: list[str] = []
    run: list[int] = []
    for il in [*(i for i in layers if i < n_layer), None]:
        if il is not None and run and il == run[-1] + 1:
            run.append(il)
            continue
        if run:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [il] if il is not None else []
    if n_layer in layers:
        parts.append("output")
    return ", ".join(parts)


def actual_placement(model: Any, n_layer: int) -> dict[str, list[int]]:
    """Device name -> the layers llama.cpp says it put there (from its load log)."""
    out: dict[str, list[int]] = {}
    for il, device in sorted(model.placement.items()):
        if il <= n_layer:
            out.setdefault(device, []).append(il)
    return out


