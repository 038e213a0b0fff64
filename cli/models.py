"""`infer pull`, `list`, `show`, `rm`: getting models and seeing what is stored."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Annotated, Any

import typer

from infer.cli import options as o
from infer.cli.errors import shielded
from infer.cli.flags import resolve
from infer.cli.human import human_ago, human_size
from infer.cli.render import print_table
from infer.runtime.errors import ModelNotFoundError, UsageError

ModelArg = Annotated[str, typer.Argument(
    help="An alias from models.toml, a Hub repo owner/repo[:QUANT], or a .gguf file.",
    show_default=False)]
JsonFlag = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


NoMmproj = Annotated[bool, typer.Option("--no-mmproj", help="Not the repository's projector (mmproj) file.")]


def pull(ctx: typer.Context, model: ModelArg, offline: o.Offline = False,
         no_mmproj: NoMmproj = False) -> None:
    """Download a model (and its repository's projector, for images and audio) into the Hugging
    Face cache without running it; print its path (and the projector's)."""
    shielded(_pull, ctx.params)


def _pull(flags: Mapping[str, Any]) -> None:
    resolved = resolve(flags, ask=not flags.get("offline"))
    what = f"{resolved.repo}:{resolved.quant}" if resolved.repo else resolved.reference
    sys.stderr.write(f"infer: {what} is ready\n")
    sys.stdout.write(f"{resolved.path}\n" + (f"{resolved.mmproj}\n" if resolved.mmproj else ""))


Catalog = Annotated[bool, typer.Option(
    "--catalog", help="List every alias instead (shipped and from your models.toml): its quant, its "
    "size (from the Hub for one not downloaded) and whether it is here.")]


def list_models(ctx: typer.Context, json_output: JsonFlag = False, catalog: Catalog = False,
                offline: o.Offline = False) -> None:
    """List the models in the Hugging Face cache and those installed packages carry (--catalog:
    every alias infer knows)."""
    shielded(_list, ctx.params)


def _list(flags: Mapping[str, Any]) -> None:
    if flags["catalog"]:
        _list_catalog(flags)
        return
    from infer.quant.store import cached_models, embedded_models

    models = embedded_models() + cached_models()
    if flags["json_output"]:
        rows = [{"alias": m.alias, "repo": None if m.package else m.repo, "quant": m.quant,
                 "file": m.path.name, "size": m.size, "path": str(m.path), "parts": len(m.files),
                 "last_used": m.last_used, "package": m.package} for m in models]
        sys.stdout.write(json.dumps(rows) + "\n")
        return
    if not models:
        sys.stderr.write("infer: no models yet (try `infer pull qwen2.5:0.5b`)\n")
        return
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for column in ("MODEL", "FILE", "QUANT", "SIZE", "LAST USED", "WHERE"):
        table.add_column(column, no_wrap=column != "WHERE")
    for m in models:
        name = m.alias or m.repo
        parts = f" (+{len(m.files) - 1} parts)" if len(m.files) > 1 else ""
        where = f"{m.path.parent} (package {m.package})" if m.package else str(m.path.parent)
        table.add_row(name, m.path.name + parts, m.quant, human_size(m.size), human_ago(m.last_used),
                      where)
    print_table(table)


def _list_catalog(flags: Mapping[str, Any]) -> None:
    from infer.quant.library import library

    found = library(offline=flags["offline"])
    if flags["json_output"]:
        rows = [{"alias": r.alias, "other_names": list(r.other_names), "repo": r.repo, "quant": r.quant,
                 "size": r.size, "downloaded": r.here is not None, "where": r.here,
                 "description": r.description, "user": r.user} for r in found.rows]
        sys.stdout.write(json.dumps(rows) + "\n")
    else:
        from rich.table import Table

        table = Table(box=None, pad_edge=False)
        for column in ("MODEL", "QUANT", "SIZE", "HERE", "DESCRIPTION"):
            table.add_column(column, no_wrap=column != "DESCRIPTION")
        for r in found.rows:
            names = r.alias + (f" ({', '.join(r.other_names)})" if r.other_names else "")
            table.add_row(names, r.quant, "?" if r.size is None else human_size(r.size),
                          r.here or "-", r.description + (" [your models.toml]" if r.user else ""))
        print_table(table)
    if found.error:
        sys.stderr.write(f"infer: {found.error}\n")


def show(ctx: typer.Context, model: ModelArg, json_output: JsonFlag = False,
         template: Annotated[bool, typer.Option("--template", help="Print the whole chat template.")] = False,
         offline: o.Offline = False) -> None:
    """Describe a model from its GGUF header, without loading its weights."""
    shielded(_show, ctx.params)


def _show(flags: Mapping[str, Any]) -> None:
    from infer.quant.describe import describe

    resolved = resolve(flags)
    info = describe(resolved.path)
    if flags["template"]:
        sys.stdout.write((info.get("chat_template") or "") + "\n")
        return
    inputs = ("text",)
    if resolved.mmproj is not None:
        from infer.runtime.llama import projector_inputs

        inputs += projector_inputs(resolved.mmproj)
    if flags["json_output"]:
        projector = str(resolved.mmproj) if resolved.mmproj is not None else None
        sys.stdout.write(json.dumps({"model": resolved.reference, "path": str(resolved.path),
                                     "package": resolved.package, "mmproj": projector,
                                     "inputs": list(inputs), **info}) + "\n")
        return
    template_text = info.get("chat_template") or ""
    lines = [
        ("model", resolved.reference), ("file", str(resolved.path)),
        *([("package", resolved.package)] if resolved.package else []),
        *([("projector", str(resolved.mmproj))] if resolved.mmproj else []),
        ("reads", ", ".join(inputs)),
        ("architecture", info["architecture"]), ("name", info.get("name") or ""),
        ("parameters", _count(info["parameters"])), ("quantization", ", ".join(
            f"{t} ({n})" for t, n in info["tensor_types"].items())),
        ("context length", str(info.get("context_length") or "?")),
        ("layers", str(info.get("layers") or "?")),
        ("heads", f"{info.get('heads') or '?'} (KV {info.get('kv_heads') or '?'})"),
        ("embedding", str(info.get("embedding") or "?")),
        ("vocabulary", f"{info.get('vocab_size') or '?'} ({info.get('tokenizer') or '?'})"),
        ("license", info.get("license") or "unknown"),
        ("sampling", ", ".join(f"{k}={v}" for k, v in info["sampling"].items()) or "llama.cpp defaults"),
        ("chat template", (template_text[:70].replace("\n", " ") + "…") if len(template_text) > 70
         else template_text or "none (llama.cpp's chatml is used)"),
    ]
    width = max(len(k) for k, _ in lines)
    sys.stdout.write("".join(f"{k:<{width}}  {v}\n" for k, v in lines))


Yes = Annotated[bool, typer.Option("-y", "--yes", help="Do not ask for confirmation.")]


def rm(ctx: typer.Context, model: ModelArg, yes: Yes = False) -> None:
    """Remove a model's files from the Hugging Face cache (one quant; all with owner/repo)."""
    shielded(_rm, ctx.params)


def _rm(flags: Mapping[str, Any]) -> None:
    from infer.quant.catalog import load_catalog
    from infer.quant.embedded import embedded_file
    from infer.quant.registry import hub_reference_for
    from infer.quant.store import find_cached, remove

    reference = flags["model"]
    entry = load_catalog().get(reference)
    hub = hub_reference_for(reference, entry)
    if hub is None:
        raise UsageError(f"{reference}: give an alias or owner/repo[:QUANT]; "
                         "infer does not delete files outside the Hugging Face cache")
    try:
        models = find_cached(hub.repo, hub.quant)
    except ModelNotFoundError:
        if entry is not None and entry.embedded is not None and embedded_file(entry.embedded):
            raise UsageError(f"{reference} is the model the package {entry.embedded.requirement} "
                             f"carries; remove it with pip uninstall {entry.embedded.requirement}"
                             ) from None
        raise
    total = sum(m.size for m in models)
    names = ", ".join(f"{m.repo}:{m.quant}" for m in models)
    if not flags["yes"]:
        if not sys.stdin.isatty():
            raise UsageError(f"refusing to remove {names} without confirmation: add -y")
        answer = input(f"Remove {names} ({human_size(total)})? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            sys.stderr.write("infer: nothing removed\n")
            return
    freed = remove(models)
    sys.stderr.write(f"infer: removed {names} ({human_size(freed)} freed)\n")


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"
