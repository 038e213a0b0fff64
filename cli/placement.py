"""Where a model goes before it loads: -ngl auto, --tensor-split, --rpc workers, --explain.

Reads the model's layout from its GGUF header, each device's free memory from
ggml, plans with ``runtime.memory_plan`` and hands the result to the loader. A
context that cannot fit fails here, before llama.cpp allocates anything.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from infer.runtime.errors import ResourceError, UsageError
from infer.runtime.memory_plan import (
    CTX_STEP,
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

    @property
    def handles(self) -> list[int]:
        return [d.handle for d in self.devices]


_LAYOUTS: dict[str, ModelLayout] = {}
_MEMO_MAX = 64


def model_layout(path: Path) -> ModelLayout:
    """The layout of the GGUF file at ``path``, remembered per file (path, size, mtime).

    Reading it walks the whole header (about 0.1 s for a 128k vocabulary), so it is
    kept in INFER_HOME/layouts.json for the next run of the same file.
    """
    from infer.quant.gguf_check import check_gguf
    from infer.quant.paths import layouts_memo
    from infer.runtime.atomic import write_atomic

    key = str(Path(path).resolve())
    if key in _LAYOUTS:
        return _LAYOUTS[key]
    st = Path(key).stat()
    stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
    memo_path = layouts_memo()
    try:
        memo = json.loads(memo_path.read_bytes())
        if not isinstance(memo, dict):
            memo = {}
    except (OSError, ValueError):
        memo = {}
    entry = memo.get(key)
    layout = None
    if isinstance(entry, dict) and entry.get("stamp") == stamp:
        try:
            fields = entry["layout"]
            layout = ModelLayout(**{**fields, "layer_bytes": tuple(fields["layer_bytes"]),
                                    "n_head_kv": tuple(fields["n_head_kv"])})
        except (KeyError, TypeError):
            layout = None
    if layout is None:
        info = check_gguf(key)
        layout = ModelLayout.from_gguf(info.metadata, ((t.name, t.shape, t.nbytes) for t in info.tensors))
        memo.pop(key, None)
        memo[key] = {"stamp": stamp, "layout": asdict(layout)}
        while len(memo) > _MEMO_MAX:
            memo.pop(next(iter(memo)))
        with contextlib.suppress(OSError):  # a read-only home only costs the next run a header read
            write_atomic(memo_path, json.dumps(memo).encode())
    _LAYOUTS[key] = layout
    return layout


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


def place(path: Path, cparams: ContextParams) -> Placed:
    """Plan the load of the model at ``path`` with ``cparams``.

    Connects to the --rpc workers (exit 4 naming one that is unreachable). A
    context given with -c that does not fit raises ResourceError (exit 5) naming the
    largest that does; the default context is shrunk instead.
    """
    from infer.runtime import ggml
    from infer.runtime.llama import flash_attention

    workers = ggml.add_workers(list(cparams.rpc)) if cparams.rpc else []
    if workers:
        guard_workers(cparams.rpc)
    offload = workers + [d for d in ggml.devices() if d.offloads]
    try:
        layout = model_layout(path)
    except LayoutError as e:  # let llama.cpp load it (and say what is wrong with it)
        return Placed(cparams, offload, None, None, unplanned=e)
    n_ctx = cparams.resolved_n_ctx(layout.n_ctx_train)
    local_gpu = cparams.n_gpu_layers != 0 and any(not d.remote for d in offload)
    flash = flash_attention(cparams, local_gpu) == "on"
    shape = ContextShape(n_ctx=n_ctx, n_ubatch=min(cparams.n_ubatch, cparams.n_batch),
                         n_seq_max=cparams.n_seq_max, type_k=cparams.cache_type_k,
                         type_v=cparams.cache_type_v, flash_attn=flash)
    cpu = next((d for d in ggml.devices() if d.kind == "cpu"), None)
    host = budget("CPU", cpu.description if cpu else "CPU", host_free(), HOST_MARGIN)
    budgets = [budget(d.name, d.description, d.free, DEVICE_MARGIN) for d in offload]

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
    return Placed(params, offload, plan, layout, shrunk_from)


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB / 10 else f"{n / (1 << 20):.0f} MiB"


def does_not_fit(plan: MemoryPlan) -> str:
    worst = next(p for p in plan.placements if not p.fits)
    need = (f"{worst.device} needs {_gib(worst.total)} (weights {_gib(worst.weights)}, "
            f"KV cache {_gib(worst.kv)}, compute {_gib(worst.compute)}) and has {_gib(worst.free)} "
            "to spare")
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


def report(placed: Placed, model: Any, write: Any = None) -> None:
    """-v: where llama.cpp put each part, and the context when it was shrunk."""
    write = write or (lambda s: sys.stderr.write(s + "\n"))
    names = {d.name: d.description for d in placed.devices}
    n_layer = model.n_layer
    parts = []
    for device, layers in actual_placement(model, n_layer).items():
        label = f"{device} ({names[device]})" if device in names else device
        parts.append(f"{label}: layers {layer_ranges(layers, n_layer)}")
    ngl = placed.params.n_gpu_layers
    write("placement: " + ("; ".join(parts) or "CPU")
          + f" (-ngl {'all' if ngl in (None, -1) else ngl})")
    if placed.unplanned is not None:
        write(f"memory plan: none ({placed.unplanned})")
    if placed.shrunk_from and placed.plan:
        write(f"context: {placed.plan.n_ctx} tokens (the default {placed.shrunk_from} does not fit)")


def explain(placed: Placed, reference: str) -> None:
    """--explain: the memory plan as a table on stdout."""
    from rich.console import Console
    from rich.table import Table

    plan, layout = placed.plan, placed.layout
    if plan is None or layout is None:
        raise placed.unplanned or LayoutError("cannot plan this model's memory")
    p = placed.params
    table = Table(title=f"{reference}: memory plan for a context of {plan.n_ctx} tokens "
                        f"(K {p.cache_type_k}, V {p.cache_type_v})", title_justify="left")
    for col, justify in (("device", "left"), ("layers", "left"), ("weights", "right"),
                         ("KV cache", "right"), ("compute", "right"), ("total", "right"),
                         ("free", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for pl in plan.placements:
        layers = layer_ranges(pl.layers, layout.n_layer)
        if pl.device == "CPU":
            layers = ", ".join(x for x in ("input", layers) if x)
        name = pl.device if pl.description in ("", pl.device) else f"{pl.device} ({pl.description})"
        table.add_row(name, layers or "-", _gib(pl.weights), _gib(pl.kv), _gib(pl.compute),
                      _gib(pl.total), _gib(pl.free), style=None if pl.fits else "bold red")
    console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160)
    console.print(table)
    console.print(f"offload: -ngl {plan.n_gpu_layers} of {layout.n_layer + 1} layers"
                  + (f", tensor split {','.join(f'{w:g}' for w in plan.tensor_split)}"
                     if plan.tensor_split else ""))
    searched = max(layout.n_ctx_train, plan.n_ctx) // CTX_STEP * CTX_STEP  # no larger is tried
    console.print(f"largest context that fits: {'at least ' if plan.max_ctx >= searched else ''}"
                  f"{plan.max_ctx} tokens "
                  f"(\"free\" leaves {_gib(HOST_MARGIN)} on the CPU and {_gib(DEVICE_MARGIN)} "
                  "on each device; compute buffers are estimates)")
    if placed.shrunk_from:
        console.print(f"the default context of {placed.shrunk_from} tokens does not fit: "
                      f"using {plan.n_ctx}")
    if not plan.fits:
        console.print(f"[bold red]{does_not_fit(plan)}[/]")


RPC_PROBE_INTERVAL = 15.0  # seconds between checks that the workers still answer, mid-decode


def rpc_timeout() -> float:
    """INFER_RPC_TIMEOUT: the longest one decode call may wait on the workers (seconds)."""
    try:
        return max(1.0, float(os.environ.get("INFER_RPC_TIMEOUT", "600")))
    except ValueError:
        raise UsageError("INFER_RPC_TIMEOUT must be a number of seconds") from None


def guard_workers(endpoints: Sequence[str], connect_timeout: float = 5.0) -> None:
    """Exit 4 with a clear message when an RPC worker dies or stops answering.

    ggml aborts the process when a worker's connection breaks, and would wait for
    ever on a worker whose machine vanished: the first becomes a message naming the
    worker, the second is caught by probing the workers while a decode runs (and by
    a hard limit on one decode call, INFER_RPC_TIMEOUT, default 600 s).
    """
    import socket  # only with --rpc: not imported on every run

    from infer.cli.errors import EXIT_INTERNAL, EXIT_NETWORK, print_error
    from infer.runtime.ggml import on_native_abort, parse_endpoint
    from infer.runtime.llama import set_decode_watchdog

    limit = rpc_timeout()

    def unreachable() -> list[str]:
        gone = []
        for e in endpoints:
            try:
                with socket.create_connection(parse_endpoint(e), timeout=connect_timeout):
                    pass
            except OSError:
                gone.append(e)
        return gone

    def fail(message: str, code: int) -> None:
        print_error(message)
        sys.stderr.flush()
        os._exit(code)  # from a native or watchdog thread: nothing else can unwind now

    def on_abort(message: str) -> None:
        detail = message.split(": ", 1)[-1]
        if "RPC" not in detail:
            fail(f"llama.cpp aborted: {detail}", EXIT_INTERNAL)
        gone = unreachable()
        for _ in range(5):  # a dying process may still hold its listening socket a moment
            if gone:
                break
            time.sleep(0.2)
            gone = unreachable()
        if gone or len(endpoints) == 1:
            named = ", ".join(gone or endpoints)
        else:
            named = "one of " + ", ".join(endpoints)
        fail(f"RPC worker {named} stopped answering ({detail})", EXIT_NETWORK)

    def check(elapsed: float) -> None:
        gone = unreachable()
        if gone:
            fail(f"RPC worker {', '.join(gone)} stopped answering (unreachable mid-generation)",
                 EXIT_NETWORK)
        if elapsed > limit:
            fail(f"the RPC workers ({', '.join(endpoints)}) gave no answer in {limit:.0f} s "
                 "(INFER_RPC_TIMEOUT)", EXIT_NETWORK)

    on_native_abort(on_abort)
    set_decode_watchdog(min(RPC_PROBE_INTERVAL, limit), check)
