"""Get models from a Hub repository into the local cache: one quant's GGUF file(s), or a checkpoint."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path

from infer.quant import hub
from infer.quant.quants import choose, choose_mmproj, group_by_quant
from infer.runtime.errors import ModelError, NetworkError


class CheckpointOnlyError(ModelError):
    """The repository has safetensors weights but no GGUF: it can be converted."""

    def __init__(self, repo: str) -> None:
        self.repo = repo
        super().__init__(f"{repo} has no GGUF files, only safetensors weights: "
                         f"`infer quantize {repo}` can convert it")


def fetch_gguf(repo: str, quant: str | None, *, offline: bool = False, progress: hub.Progress | None = None,
               mmproj: bool | str = True, ask: bool = False) -> tuple[Path, str, Path | None]:
    """Download (or find in the cache) the chosen quant of `repo`: the first file's path, the
    quant, and the repository's multimodal projector if it has one (`mmproj`: fetch it, by
    this name if a string; False: not). A cached model's projector is the cache's, unless
    `ask` (infer pull): then the Hub's listing is read again and what is missing fetched.

    Split GGUFs come whole: every part is fetched, and llama.cpp opens the first.
    """
    offline = hub.offline_mode(offline)
    here = hub.cached_files(repo)
    cached = _from_cache(repo, quant, here) if not ask or offline else None
    if cached is not None:  # downloaded once, reused from then on without asking the Hub
        name = choose_mmproj(list(here), mmproj if isinstance(mmproj, str) else None) if mmproj else None
        return (*cached, here[name] if name is not None else None)
    if _checkpoint_cached(repo):  # a safetensors repo fetched before for conversion
        raise CheckpointOnlyError(repo)
    files = hub.list_files(repo, offline=offline, wanted=f"its {quant} GGUF" if quant else "a GGUF file")
    by_path = {f.path: f for f in files}
    groups = group_by_quant(list(by_path))
    if not groups:
        if any(f.path.endswith(".safetensors") for f in files):
            raise CheckpointOnlyError(repo)
        raise ModelError(f"{repo} has no GGUF files")
    if offline and quant and quant.upper() not in groups:  # (the cache holds other quants)
        raise NetworkError(f"{repo}: its {quant} GGUF is not in the Hugging Face cache (it holds "
                           f"{', '.join(sorted(groups))}) and {hub.OFFLINE_HINT}")
    chosen = choose(groups, quant, repo=repo)
    name = choose_mmproj(list(by_path), mmproj if isinstance(mmproj, str) else None) if mmproj else None
    wanted = [*chosen.files, *([name] if name is not None else [])]
    paths = hub.download(repo, [by_path.get(p, hub.RepoFile(p)) for p in wanted], offline=offline,
                         progress=progress)
    return paths[0], chosen.quant, paths[-1] if name is not None else None


def _from_cache(repo: str, quant: str | None, cached: dict[str, Path]) -> tuple[Path, str] | None:
    """The requested quant (or, without one, the best cached quant) if all its files are among
    the `cached` ones."""
    groups = group_by_quant(list(cached))
    if not groups or (quant is not None and quant.upper() not in groups):
        return None
    chosen = choose(groups, quant, repo=repo)
    if not all(p in cached for p in chosen.files):
        return None
    return cached[chosen.files[0]], chosen.quant


# What converting a safetensors checkpoint needs, and nothing that unpickles (.bin, .pt).
CHECKPOINT_FILES = (
    "config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json",
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
    "added_tokens.json", "vocab.json", "merges.txt", "chat_template.jinja",
    "README.md",  # its front matter names the license
)


def checkpoint_files(paths: list[str]) -> list[str]:
    """The files of a repository that conversion needs (top level only)."""
    return [p for p in paths if "/" not in p
            and any(fnmatch.fnmatch(p, pattern) for pattern in CHECKPOINT_FILES)]


def fetch_checkpoint(repo: str, *, offline: bool = False,
                     progress: hub.Progress | None = None) -> Path:
    """Download what conversion needs from a safetensors repository; return its snapshot folder."""
    offline = hub.offline_mode(offline)
    cached = _checkpoint_cached(repo)
    if cached is not None:  # downloaded before: no need to ask the Hub
        return cached
    files = hub.list_files(repo, offline=offline)
    wanted = [f for f in files if f.path in set(checkpoint_files([f.path for f in files]))]
    if not any(f.path.endswith(".safetensors") for f in wanted):
        raise ModelError(f"{repo} has no safetensors weights to convert")
    # The architecture is checked before any weights are downloaded.
    config = next((f for f in wanted if f.path == "config.json"), None)
    if config is None:
        raise ModelError(f"{repo} has no config.json")
    (config_path,) = hub.download(repo, [config], offline=offline)
    from infer.quant.convert import check_architecture
    from infer.quant.convert.checkpoint import read_config

    check_architecture(read_config(config_path.parent), repo)
    paths = hub.download(repo, wanted, offline=offline, progress=progress)
    return paths[0].parent


def _checkpoint_cached(repo: str) -> Path | None:
    """The snapshot folder of a complete safetensors checkpoint of `repo` in the cache (no GGUF)."""
    cached = hub.cached_files(repo)
    if "config.json" not in cached or group_by_quant(list(cached)):
        return None
    if not any(p.endswith(".safetensors") for p in cached):
        return None
    index = cached.get("model.safetensors.index.json")
    try:
        shards = set(json.loads(index.read_text())["weight_map"].values()) if index else set()
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return cached["config.json"].parent if shards <= set(cached) else None
