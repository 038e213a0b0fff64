"""The prompt cache on disk: where it is, how big it may grow, and `infer cache list|clear`."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping
from typing import Annotated, Any

import typer

from infer.cli import options as o
from infer.cli.errors import shielded
from infer.cli.render import print_table
from infer.runtime.errors import UsageError

SIZE_VARIABLE = "INFER_PROMPT_CACHE_SIZE"
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}

cache_app = typer.Typer(help="The prompt cache: KV states of long prompts, reused across runs.",
                        no_args_is_help=True)


def open_cache() -> Any:
    """The prompt cache in INFER_HOME/cache/prompts, capped by INFER_PROMPT_CACHE_SIZE (default 2G)."""
    from infer.quant.paths import infer_home
    from infer.runtime.prompt_cache import DEFAULT_MAX_BYTES, PromptCache

    size = os.environ.get(SIZE_VARIABLE, "").strip()
    return PromptCache(infer_home() / "cache" / "prompts",
                       max_bytes=parse_size(size) if size else DEFAULT_MAX_BYTES)


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?", text.strip(), re.IGNORECASE)
    if not m:
        raise UsageError(f"{SIZE_VARIABLE}={text!r}: give a size such as 500M or 4G")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


@cache_app.command("list")
def list_entries(ctx: typer.Context, json_output: Annotated[bool, typer.Option(
        "--json", help="Machine-readable output.")] = False) -> None:
    """List the cached prompt states: model, tokens, size, last use."""
    shielded(_list, ctx.params)


def _list(flags: Mapping[str, Any]) -> None:
    from infer.cli.models import human_ago, human_size

    cache = open_cache()
    entries = cache.entries()
    if flags["json_output"]:
        sys.stdout.write(json.dumps([{"model": e.model, "tokens": e.n_tokens, "size": e.size,
                                      "last_used": e.last_used, "path": str(e.path)}
                                     for e in entries]) + "\n")
        return
    if not entries:
        sys.stderr.write(f"infer: the prompt cache is empty ({cache.folder})\n")
        return
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for column in ("MODEL", "TOKENS", "SIZE", "LAST USED"):
        table.add_column(column, no_wrap=True)
    for e in entries:
        table.add_row(e.model, str(e.n_tokens), human_size(e.size), human_ago(e.last_used))
    print_table(table)
    total = sum(e.size for e in entries)
    sys.stderr.write(f"infer: {len(entries)} entries, {human_size(total)} of {human_size(cache.max_bytes)} "
                     f"in {cache.folder}\n")


@cache_app.command("clear")
def clear(ctx: typer.Context, model: Annotated[str | None, typer.Option(
        "--model", help="Only the entries of this model (a .gguf file, an alias, or owner/repo[:QUANT]).",
        show_default=False)] = None) -> None:
    """Remove cached prompt states (all of them, or one model's)."""
    shielded(_clear, ctx.params)


def _clear(flags: Mapping[str, Any]) -> None:
    from infer.cli.models import human_size

    cache = open_cache()
    entries = cache.entries()
    if flags["model"] is not None:
        from infer.runtime.session import content_digest

        resolved = o.resolve({"model": flags["model"], "offline": True})
        digest = content_digest(resolved.path)
        entries = [e for e in entries if e.model_digest == digest]
    cache.remove(entries)
    sys.stderr.write(f"infer: removed {len(entries)} entries ({human_size(sum(e.size for e in entries))})\n")
