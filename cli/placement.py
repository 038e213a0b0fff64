"""The placement on the terminal: -v's line of where llama.cpp put each part, --explain's
table of the memory plan, and the guard that turns a lost --rpc worker into exit 4.

The plan itself is the library's (runtime/placement.py, runtime/loading.py).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from infer.runtime.errors import UsageError
from infer.runtime.memory_plan import CTX_STEP, DEVICE_MARGIN, HOST_MARGIN, LayoutError
from infer.runtime.placement import Placed, actual_placement, does_not_fit, layer_ranges, size_text


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
        table.add_row(name, layers or "-", size_text(pl.weights), size_text(pl.kv), size_text(pl.compute),
                      size_text(pl.total), size_text(pl.free), style=None if pl.fits else "bold red")
    console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160)
    console.print(table)
    if placed.reserved is not None:
        console.print(f"projector (images, audio): {size_text(placed.reserved[1])} kept on "
                      f"{placed.reserved[0]} (its weights, beside the table's)")
    console.print(f"offload: -ngl {plan.n_gpu_layers} of {layout.n_layer + 1} layers"
                  + (f", tensor split {','.join(f'{w:g}' for w in plan.tensor_split)}"
                     if plan.tensor_split else ""))
    searched = max(layout.n_ctx_train, plan.n_ctx) // CTX_STEP * CTX_STEP  # no larger is tried
    console.print(f"largest context that fits: {'at least ' if plan.max_ctx >= searched else ''}"
                  f"{plan.max_ctx} tokens "
                  f"(\"free\" leaves {size_text(HOST_MARGIN)} on the CPU and {size_text(DEVICE_MARGIN)} "
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
