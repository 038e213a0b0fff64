"""Get the GGUF file(s) of one quant of a Hub repository into the local cache."""

from __future__ import annotations

from pathlib import Path

from infer.quant import hub
from infer.quant.quants import choose, group_by_quant
from infer.runtime.errors import ModelError, NetworkError


def fetch_gguf(repo: str, quant: str | None, *, offline: bool = False,
               progress: hub.Progress | None = None) -> tuple[Path, str]:
    """Download (or find in the cache) the chosen quant of `repo`: the first file's path, the quant.

    Split GGUFs come whole: every part is fetched, and llama.cpp opens the first.
    """
    offline = hub.offline_mode(offline)
    cached = _from_cache(repo, quant)
    if cached is not None:  # downloaded once, reused from then on without asking the Hub
        return cached
    files = hub.list_files(repo, offline=offline)
    by_path = {f.path: f for f in files}
    groups = group_by_quant(list(by_path))
    if not groups:
        if any(f.path.endswith(".safetensors") for f in files):
            raise ModelError(f"{repo} has no GGUF files, only safetensors weights: "
                             f"`infer quantize {repo}` can convert it")
        raise ModelError(f"{repo} has no GGUF files")
    chosen = choose(groups, quant, repo=repo)
    paths = hub.download(repo, [by_path.get(p, hub.RepoFile(p)) for p in chosen.files],
                         offline=offline,
                         progress=progress)
    return paths[0], chosen.quant


def _from_cache(repo: str, quant: str | None) -> tuple[Path, str] | None:
    """The requested quant (or, without one, the best cached quant) if all its files are cached."""
    try:
        files = hub.list_files(repo, offline=True)
    except NetworkError:
        return None
    groups = group_by_quant([f.path for f in files])
    if not groups or (quant is not None and quant.upper() not in groups):
        return None
    chosen = choose(groups, quant, repo=repo)
    present = {f.path for f in files}
    if not all(p in present for p in chosen.files):
        return None
    paths = hub.download(repo, [hub.RepoFile(p) for p in chosen.files], offline=True)
    return paths[0], chosen.quant
