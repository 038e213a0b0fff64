"""`infer cache list|clear`: the prompt cache's entries (cli/prompt_cache.py opens it)."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Annotated, Any

import typer

from infer.cli.errors import shielded
from infer.cli.flags import resolve
from infer.cli.prompt_cache import open_cache
from infer.cli.render import print_table

cache_app = typer.Typer(help="The prompt cache: KV states of long prompts, reused across runs.",
                        no_args_is_help=True)


@cache_app.command("list")
def list_entries(ctx: typer.Context, json_output: Annotated[bool, typer.Option(
        "--json", help="Machine-readable output.")] = False) -> None:
    """List the cached prompt states: model, tokens, size, last use."""
    shielded(_list, ctx.params)


def _list(flags: Mapping[str, Any]) -> None:
    from infer.cli.human import human_ago, human_size

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
    from infer.cli.human import human_size

    cache = open_cache()
    entries = cache.entries()
    if flags["model"] is not None:
        from infer.runtime.session import content_digest

        resolved = resolve({"model": flags["model"], "offline": True})
        digest = content_digest(resolved.path)
        entries = [e for e in entries if e.model_digest == digest]
    cache.remove(entries)
    sys.stderr.write(f"infer: removed {len(entries)} entries ({human_size(sum(e.size for e in entries))})\n")
