"""The local model store: GGUF models in the Hugging Face cache, when they were last used, removal.

Models stay where huggingface_hub put them; listing goes through its cache scanner
and removal through its cache API, one quant's files at a time.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infer.quant.catalog import load_catalog
from infer.quant.paths import last_used_memo
from infer.quant.quants import group_by_quant
from infer.runtime.atomic import write_atomic
from infer.runtime.errors import ModelNotFoundError


@dataclass(frozen=True)
class LocalModel:
    repo: str
    quant: str
    files: tuple[Path, ...]  # the snapshot paths of every part, first part first
    size: int  # bytes on disk, all parts
    last_used: float | None  # seconds since the epoch, when `infer` last ran it
    alias: str | None = None
    package: str | None = None  # the installed package that carries it (embedded models)

    @property
    def path(self) -> Path:
        return self.files[0]


def record_use(path: Path, at: float | None = None) -> None:
    """Remember that the model at `path` ran now, or at time `at` (for `infer list`); never
    fails a run."""
    usage_path = last_used_memo()
    usage = _read_usage(usage_path)
    usage[str(path)] = time.time() if at is None else at
    with contextlib.suppress(OSError):
        write_atomic(usage_path, json.dumps(usage).encode())


def _read_usage(path: Path) -> dict[str, float]:
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def cached_models() -> list[LocalModel]:
    """Every GGUF model (one per repository and quant) in the Hugging Face cache."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        cache = scan_cache_dir()
    except CacheNotFound:
        return []
    usage = _read_usage(last_used_memo())
    aliases = {(e.repo, e.quant.upper()): e.alias for e in load_catalog().values()}
    models = []
    for repo in cache.repos:
        if repo.repo_type != "model":
            continue
        for revision in repo.revisions:
            files = {_relative(f, revision): f for f in revision.files}
            for quant, group in group_by_quant(list(files)).items():
                present = [files[p] for p in group.files if p in files]
                if not present:
                    continue
                first = present[0].file_path
                models.append(LocalModel(
                    repo=repo.repo_id, quant=quant,
                    files=tuple(f.file_path for f in present),
                    size=sum(f.size_on_disk for f in present),
                    last_used=usage.get(str(first.resolve())) or usage.get(str(first)),
                    alias=aliases.get((repo.repo_id, quant)),
                ))
    return sorted(models, key=lambda m: (m.repo.lower(), m.quant))


def embedded_models() -> list[LocalModel]:
    """The models that installed packages carry (``embedded`` in models.toml), one per file."""
    from infer.quant.embedded import embedded_file
    from infer.quant.quants import quant_of

    usage = _read_usage(last_used_memo())
    found: dict[Path, LocalModel] = {}
    for entry in load_catalog().values():
        path = embedded_file(entry.embedded) if entry.embedded is not None else None
        if path is None or path in found:
            continue
        found[path] = LocalModel(
            repo=entry.repo, quant=quant_of(path.name) or "?", files=(path,),
            size=path.stat().st_size, last_used=usage.get(str(path.resolve())),
            alias=entry.alias, package=entry.embedded.requirement)  # type: ignore[union-attr]
    return list(found.values())


def _relative(file_info: Any, revision: Any) -> str:
    return str(Path(file_info.file_path).relative_to(revision.snapshot_path)).replace("\\", "/")


def find_cached(repo: str, quant: str | None) -> list[LocalModel]:
    """The cached models of `repo` (one quant, or all when `quant` is None)."""
    found = [m for m in cached_models() if m.repo == repo
             and (quant is None or m.quant == quant.upper())]
    if not found:
        what = f"{repo}:{quant}" if quant else repo
        raise ModelNotFoundError(f"{what} is not in the Hugging Face cache")
    return found


def remove(models: list[LocalModel]) -> int:
    """Delete these models' files through huggingface_hub's cache API; return bytes freed."""
    from huggingface_hub import scan_cache_dir

    wanted = {p for m in models for p in m.files}
    cache = scan_cache_dir()
    infos = [f for repo in cache.repos for rev in repo.revisions for f in rev.files
             if f.file_path in wanted]
    strategy = cache.delete_files(*infos)
    freed = int(strategy.expected_freed_size)
    strategy.execute()
    return freed
