"""`infer quantize SRC`: Hugging Face checkpoints and GGUFs to any llama.cpp quant type."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from infer.cli import options as o
from infer.cli.errors import shielded


def quantize(
    ctx: typer.Context,
    src: Annotated[str, typer.Argument(
        help="A Hugging Face model folder, a Hub repo with safetensors, an alias, or a GGUF file.",
        show_default=False)],
    type_: Annotated[str, typer.Option("--type", help="Quant type: Q4_K_M, Q8_0, F16, IQ4_XS...")]
    = "Q4_K_M",
    output: Annotated[str | None, typer.Option("-o", "--output", help="Output file (default: "
                                               "INFER_HOME/models/<Name>-<Size>-<TYPE>.gguf).")] = None,
    threads: o.Threads = None,
    no_repack: o.NoRepack = False,
    imatrix: Annotated[str | None, typer.Option(
        "--imatrix", help="An importance matrix from llama-imatrix (GGUF or .dat).")] = None,
    check: Annotated[bool | None, typer.Option(
        "--check/--no-check", help="Compare with the source model and print what the quant cost "
        "(default: on when the source is F32/F16/BF16).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="The result as JSON.")] = False,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Print the plan (each tensor's type, the estimated size); write nothing.")]
    = False,
    offline: o.Offline = False,
) -> None:
    """Convert and quantize a model; `infer run` then finds it by its file name."""
    shielded(_quantize, ctx.params)


def _quantize(flags: Mapping[str, Any]) -> None:
    from infer.cli.flags import repack_wanted
    from infer.cli.progress import DownloadProgress
    from infer.quant.build import build, find_source
    from infer.quant.quantize import file_type

    imatrix = Path(flags["imatrix"]) if flags["imatrix"] else None
    quant, _ = file_type(flags["type_"], imatrix=imatrix)  # a bad type fails before any work
    with DownloadProgress() as downloads:
        source = find_source(flags["src"], offline=flags["offline"], progress=downloads)
    if flags["dry_run"]:
        _print_plan(source, quant, as_json=flags["json_output"])
        return
    result = build(source, quant, Path(flags["output"]) if flags["output"] else None,
                   threads=flags["threads"] or 0, imatrix=imatrix, check=flags["check"],
                   repack=repack_wanted(flags), progress=_report)
    out, report = result.path, result.quality
    sys.stderr.write("\n" if sys.stderr.isatty() else "")
    if flags["json_output"]:
        quality = None if report is None else {
            "size_bytes": report.size_bytes, "bits_per_weight": report.bits_per_weight,
            "mean_kl_divergence": report.mean_kl, "top1_agreement": report.top1_agreement,
            "tokens": report.tokens, **({"embedding_cosine_mean": report.cosine[0],
                                         "embedding_cosine_min": report.cosine[1]} if report.cosine else {})}
        sys.stdout.write(json.dumps({"path": str(out), "type": quant, "quality": quality}) + "\n")
        return
    sys.stderr.write(f"infer: wrote {out.name} ({out.stat().st_size / 1e6:,.1f} MB); run it with "
                     f"`infer {_command_for(out)} {out.stem}`\n")
    if report is not None:
        _print_quality(quant, report)
    sys.stdout.write(f"{out}\n")


def _command_for(path: Path) -> str:
    """The command that uses the model: run, or embed / rerank where its GGUF records a pooling."""
    from infer.quant.gguf_check import check_gguf

    pooling = check_gguf(path).pooling
    return "run" if pooling is None else "rerank" if pooling == "rank" else "embed"


def _print_quality(quant: str, report: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{quant} against the full-precision source ({report.tokens} tokens)")
    measures = (("mean KL divergence", "top-1 agreement") if report.cosine is None
                else ("embedding cosine, mean", "least"))
    for column in ("size", "bits/weight", *measures):
        table.add_column(column, justify="right")
    figures = ((f"{report.mean_kl:.5f}", f"{report.top1_agreement:.1%}") if report.cosine is None
               else (f"{report.cosine[0]:.5f}", f"{report.cosine[1]:.5f}"))
    table.add_row(f"{report.size_bytes / 1e6:,.1f} MB", f"{report.bits_per_weight:.2f}", *figures)
    Console(stderr=True).print(table)


def _report(stage: str, item: str, index: int, count: int) -> None:
    if sys.stderr.isatty():
        sys.stderr.write(f"\r\033[2K{stage}: [{index}/{count}] {item}")
        sys.stderr.flush()
    elif index == count:
        sys.stderr.write(f"infer: {stage}: {count} tensors done\n")


def _print_plan(source: Any, quant: str, *, as_json: bool) -> None:
    from infer.quant.build import plan

    p = plan(source, quant)
    if as_json:
        sys.stdout.write(json.dumps({
            "architecture": p.architecture, "parameters": p.parameters, "type": quant,
            "estimated_bytes": p.estimated_bytes,
            "tensors": [{"name": n, "shape": list(s), "type": t} for n, s, t in p.tensors]}) + "\n")
        return
    lines = [f"architecture  {p.architecture}", f"parameters    {p.parameters:,}",
             f"type          {quant} (llama.cpp may keep some tensors at a higher type)",
             f"estimated     {p.estimated_bytes / 1e6:,.1f} MB", ""]
    width = max(len(n) for n, _, _ in p.tensors)
    lines += [f"{n:<{width}}  {'x'.join(map(str, s)):>16}  {t}" for n, s, t in p.tensors]
    sys.stdout.write("\n".join(lines) + "\n")
