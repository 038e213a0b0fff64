"""The catalog as a library page: every alias (shipped and the user's), its quant, its size
and whether it is here (`infer list --catalog`).

A model that is here is measured on disk: the file an installed package carries, or
the alias's quant in the Hugging Face cache. The size of one that is not comes from
the Hub (the repository's file listing, asked for all of them at once); offline, or
with the Hub unreachable, it is unknown and `error` says why.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from infer.quant import hub
from infer.quant.catalog import SHIPPED, CatalogEntry, load_catalog
from infer.quant.quants import choose, group_by_quant
from infer.runtime.errors import InferError

HUB_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class LibraryRow:
    alias: str
    other_names: tuple[str, ...]
    repo: str
    quant: str
    description: str
    size: int | None  # bytes, all parts; None: unknown (not here, and the Hub did not say)
    here: str | None  # "package NAME", "cache", or None: not downloaded
    user: bool  # the entry comes from (or is changed by) the user's models.toml


@dataclass(frozen=True)
class Library:
    rows: list[LibraryRow]
    error: str | None = None  # why some sizes are unknown (offline, the Hub unreachable)


def library(*, offline: bool = False) -> Library:
    """Every catalog entry once (under its own alias), with its size and where it is."""
    from infer.quant.store import cached_models, embedded_models

    entries: dict[str, CatalogEntry] = {}
    for entry in load_catalog().values():  # other names map to the same entry
        entries.setdefault(entry.alias, entry)
    embedded = {m.alias: m for m in embedded_models()}
    cached = {(m.repo, m.quant): m for m in cached_models()}
    found: dict[str, tuple[str, int, str]] = {}  # alias -> the quant here, its size, where
    for alias, entry in entries.items():
        if alias in embedded:  # the package's file, whatever quant the Hub fallback names
            m = embedded[alias]
            found[alias] = (m.quant, m.size, f"package {m.package}")
        elif (entry.repo, entry.quant.upper()) in cached:
            found[alias] = (entry.quant.upper(), cached[(entry.repo, entry.quant.upper())].size, "cache")
    missing = [e for a, e in entries.items() if a not in found]
    sizes, error = _hub_sizes(missing, offline=hub.offline_mode(offline))
    rows = [LibraryRow(alias=alias, other_names=entry.aliases, repo=entry.repo,
                       quant=found[alias][0] if alias in found else entry.quant.upper(),
                       description=entry.description,
                       size=found[alias][1] if alias in found else sizes.get(alias),
                       here=found[alias][2] if alias in found else None,
                       user=entry.origin != SHIPPED)
            for alias, entry in entries.items()]
    return Library(rows, error)


def _hub_sizes(entries: list[CatalogEntry], *, offline: bool) -> tuple[dict[str, int], str | None]:
    """The size of each entry's quant on the Hub, by alias; why some are unknown."""
    if not entries:
        return {}, None
    if offline:
        return {}, f"sizes of models not downloaded are unknown: {hub.OFFLINE_HINT}"
    repos = sorted({e.repo for e in entries})
    with ThreadPoolExecutor(max_workers=min(8, len(repos))) as pool:
        listed = dict(zip(repos, pool.map(_listing, repos), strict=True))
    sizes: dict[str, int] = {}
    errors: list[str] = []
    for entry in entries:
        files = listed[entry.repo]
        if isinstance(files, str):
            errors.append(files)
            continue
        try:
            chosen = choose(group_by_quant(list(files)), entry.quant, repo=entry.repo)
        except InferError as e:
            errors.append(str(e))
            continue
        parts = [files[p] for p in chosen.files]
        if all(size is not None for size in parts):
            sizes[entry.alias] = sum(parts)  # type: ignore[arg-type]
    if not errors:
        return sizes, None
    return sizes, (f"{len(errors)} size{'s' * (len(errors) != 1)} unknown, the Hub did not say: "
                   f"{errors[0]}{' (and more)' if len(errors) > 1 else ''}")


def _listing(repo: str) -> dict[str, int | None] | str:
    """A repository's files and their sizes, or why the Hub did not say."""
    from huggingface_hub import HfApi

    try:
        info = HfApi().model_info(repo, files_metadata=True, timeout=HUB_TIMEOUT_S)
    except Exception as e:  # said as infer's error, one line
        return str(hub.hub_error(e, repo))
    return {s.rfilename: s.size for s in info.siblings or []}
