"""`infer bench MODEL`: prefill and decode speed, like llama.cpp's llama-bench."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Annotated, Any

import typer

from infer.cli import options as o
from infer.cli.errors import shielded
from infer.cli.flags import context_params, load_plan, log_to_stderr, resolve
from infer.cli.placement import explain, report
from infer.runtime.errors import UsageError


def bench(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(
        help="A .gguf file, an alias from models.toml, or a Hub repo owner/repo[:QUANT].",
        show_default=False)],
    n_prompt: Annotated[list[int] | None, typer.Option(
        "-p", "--n-prompt", help="Prompt sizes to prefill (default 512); repeatable.")] = None,
    n_gen: Annotated[list[int] | None, typer.Option(
        "-n", "--n-gen", help="Token counts to generate (default 128); repeatable.")] = None,
    repetitions: Annotated[int, typer.Option("-r", "--repetitions", help="Runs of each test.")] = 5,
    json_output: Annotated[bool, typer.Option("--json", help="Results as JSON.")] = False,
    threads: o.Threads = None,
    ctx_size: o.CtxSize = None,
    batch_size: o.BatchSize = 2048,
    ubatch_size: o.UbatchSize = 512,
    gpu_layers: o.GpuLayers = None,
    tensor_split: o.TensorSplit = None,
    rpc: o.Rpc = None,
    explain: o.Explain = False,
    flash_attn: o.FlashAttn = "auto",
    cache_type_k: o.CacheTypeK = "f16",
    cache_type_v: o.CacheTypeV = "f16",
    no_repack: o.NoRepack = False,
    verbose: o.Verbose = False,
    offline: o.Offline = False,
) -> None:
    """Measure prefill (pp) and decode (tg) tokens per second, mean ± stddev."""
    shielded(execute, ctx.params)


def execute(flags: Mapping[str, Any]) -> None:
    from infer.runtime.bench import bench_decode, bench_prefill

    flags = {**flags, "n_prompt": flags["n_prompt"] or [512], "n_gen": flags["n_gen"] or [128]}
    if flags["repetitions"] < 1:
        raise UsageError(f"repetitions must be at least 1, got {flags['repetitions']}")
    sizes = [*flags["n_prompt"], *flags["n_gen"]]
    if any(n < 1 for n in sizes):
        raise UsageError("prompt sizes and generated token counts must be at least 1")
    needed = max(sizes) + 1
    flags = {**flags, "ctx_size": flags["ctx_size"] or max(needed, 512)}
    context_params(flags)  # bad values fail before the model is looked up
    resolved = resolve(flags)
    plan = load_plan(flags, resolved)
    placed = plan.placed
    if flags["explain"]:
        explain(placed, resolved.reference)
        return
    if flags["verbose"]:
        log_to_stderr()
    results = []
    with plan.open_session() as session:
        if flags["verbose"]:
            report(placed, session.model)
        if needed > session.n_ctx:
            raise UsageError(f"a test of {needed - 1} tokens does not fit the context of "
                             f"{session.n_ctx} tokens (raise -c/--ctx-size)")
        info: dict[str, Any] = {"model": resolved.reference, "description": session.model.description(),
                "params": session.model.n_params, "threads": session.context.n_threads}
        for n in flags["n_prompt"]:
            results.append(bench_prefill(session, n, flags["repetitions"]))
        for n in flags["n_gen"]:
            results.append(bench_decode(session, n, flags["repetitions"]))
    if flags["json_output"]:
        rows = [{"test": r.test, "tokens": r.n_tokens, "mean_tps": r.mean, "stdev_tps": r.stdev,
                 "samples_tps": list(r.tokens_per_second)} for r in results]
        sys.stdout.write(json.dumps({**info, "results": rows}) + "\n")
        return
    from rich.console import Console
    from rich.table import Table

    # llama.cpp's description is "ARCH SIZE TYPE", its SIZE a guess from the layer count ("llama
    # 256M" for a 135M model): the architecture and the type, with the real count of parameters.
    arch, _, rest = info["description"].partition(" ")
    kind = rest.partition(" ")[2] or rest
    console = Console(highlight=False)
    console.print(f"{info['model']} ({arch}, {kind}) · {info['params'] / 1e6:.0f}M parameters · "
                  f"{info['threads']} threads")
    table = Table()
    for col in ("test", "tokens/s"):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(r.test, f"{r.mean:.2f} ± {r.stdev:.2f}")
    console.print(table)
