"""`infer quantize SRC`: Hugging Face checkpoints and GGUFs to any llama.cpp quant type."""

from __future__ import annotations

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
    offline: o.Offline = False,
) -> None:
    """Convert and quantize a model; `infer run` then finds it by its file name."""
    shielded(_quantize, ctx.params)


def _quantize(flags: Mapping[str, Any]) -> None:
    from infer.cli.progress import DownloadProgress
    from infer.quant.build import build, find_source
    from infer.quant.quantize import file_type

    quant, _ = file_type(flags["type_"])  # a bad type fails before any work
    with DownloadProgress() as downloads:
        source = find_source(flags["src"], offline=flags["offline"], progress=downloads)
    out = build(source, quant, Path(flags["output"]) if flags["output"] else None,
                threads=flags["threads"] or 0, progress=_report)
    sys.stderr.write("\n" if sys.stderr.isatty() else "")
    size = out.stat().st_size
    sys.stderr.write(f"infer: wrote {out.name} ({size / 1e6:,.1f} MB); run it with "
                     f"`infer run {out.stem}`\n")
    sys.stdout.write(f"{out}\n")


def _report(stage: str, item: str, index: int, count: int) -> None:
    if sys.stderr.isatty():
        sys.stderr.write(f"\r\033[2K{stage}: [{index}/{count}] {item}")
        sys.stderr.flush()
    elif index == count:
        sys.stderr.write(f"infer: {stage}: {count} tensors done\n")
