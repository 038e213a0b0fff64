"""The Hugging Face Hub: list a repository's files, download into the standard cache, verify.

Files go into the standard Hugging Face cache (``HF_HOME``/``HF_HUB_CACHE``) through
``huggingface_hub``, which resumes interrupted downloads and lets concurrent
downloads of one file wait for each other. infer never copies a model out of the
cache and never writes into ``snapshots/``; after a download it checks the file's
SHA-256 against the Hub's LFS metadata and removes a file that does not match.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infer.runtime.errors import NetworkError

# progress(filename, bytes_done, bytes_total)
Progress = Callable[[str, int, int], None]

# huggingface_hub's first request of a process otherwise also fetches a telemetry
# registry (a 3 s wait when the Hub is unreachable). Users can still turn it on.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


class IntegrityError(NetworkError):
    """A downloaded file does not match the Hub's checksum (exit code 4)."""


@dataclass(frozen=True)
class RepoFile:
    path: str
    size: int | None = None
    sha256: str | None = None  # LFS files only


def offline_mode(flag: bool = False) -> bool:
    """Offline when asked by flag or by HF_HUB_OFFLINE (read at call time, not import)."""
    return flag or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def cached_files(repo: str) -> dict[str, Path]:
    """The files of `repo`'s main revision already in the cache, by repository path.

    Reads the cache's documented layout (``models--owner--name/refs/main``, then
    ``snapshots/<commit>/``) without importing huggingface_hub's HTTP stack, which
    would cost a cached run about 0.3 s of start-up.
    """
    snapshot = _cached_snapshot(repo)
    if snapshot is None:
        return {}
    return {str(p.relative_to(snapshot)).replace(os.sep, "/"): p
            for p in sorted(snapshot.rglob("*")) if p.is_file()}


OFFLINE_HINT = "infer is offline (unset HF_HUB_OFFLINE or drop --offline to download it)"


def list_files(repo: str, *, offline: bool, wanted: str | None = None) -> list[RepoFile]:
    """The files of `repo` at its main revision: from the Hub, or from the cache when offline
    (`wanted`: what the caller looks for, named in the error of an offline miss)."""
    if offline:
        cached = cached_files(repo)
        if not cached:
            what = f"{repo} ({wanted})" if wanted else repo
            raise NetworkError(f"{what} is not in the Hugging Face cache and {OFFLINE_HINT}")
        return [RepoFile(path) for path in cached]
    from huggingface_hub import HfApi

    try:
        info = HfApi().model_info(repo, files_metadata=True)
    except Exception as e:
        raise hub_error(e, repo) from None
    return [RepoFile(s.rfilename, s.size, s.lfs.sha256 if s.lfs else None)
            for s in info.siblings or []]


def download(repo: str, files: list[RepoFile], *, offline: bool,
             progress: Progress | None = None) -> list[Path]:
    """Make every file of `files` present in the cache; return their local paths in order."""
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    paths = []
    for f in files:
        cached = try_to_load_from_cache(repo, f.path)
        if isinstance(cached, str):
            paths.append(Path(cached))
            continue
        if offline:
            raise NetworkError(f"{repo}: {f.path} is not in the Hugging Face cache and {OFFLINE_HINT}")
        # One download per file even when several infer processes ask at once: the
        # others wait here, then find the file in the cache.
        with _download_lock(repo, f.path):
            cached = try_to_load_from_cache(repo, f.path)
            if isinstance(cached, str):
                paths.append(Path(cached))
                continue
            try:
                local = Path(hf_hub_download(repo, f.path,
                                             tqdm_class=_progress_class(f.path, progress)))
            except Exception as e:  # translated into infer's errors
                raise hub_error(e, repo, f.path) from None
            if f.sha256 is not None:
                verify(local, f.sha256, repo=repo)
        paths.append(local)
    return paths


def _download_lock(repo: str, filename: str) -> Any:
    from filelock import FileLock
    from huggingface_hub import constants

    locks = Path(constants.HF_HUB_CACHE) / ".locks" / "infer"
    locks.mkdir(parents=True, exist_ok=True)
    name = hashlib.sha256(f"{repo}/{filename}".encode()).hexdigest()[:32]
    return FileLock(str(locks / f"{name}.lock"))


def verify(local: Path, sha256: str, *, repo: str) -> None:
    """Check a freshly downloaded file; on mismatch remove it from the cache and fail."""
    digest = hashlib.sha256()
    with open(local, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() == sha256:
        return
    blob = local.resolve()
    for path in (local, blob):
        path.unlink(missing_ok=True)
    raise IntegrityError(f"{repo}: {local.name} is corrupt (SHA-256 {digest.hexdigest()[:12]}… "
                         f"instead of {sha256[:12]}…); it was removed, run the command again")


def hub_error(e: Exception, repo: str, filename: str | None = None) -> Exception:
    """A huggingface_hub exception as one of infer's errors with a clear next step."""
    from huggingface_hub import errors

    what = f"{repo}/{filename}" if filename else repo
    if isinstance(e, errors.GatedRepoError):
        return NetworkError(f"{repo} is gated: accept its terms at https://huggingface.co/{repo} "
                            "and set HF_TOKEN to a token of that account")
    if isinstance(e, errors.RepositoryNotFoundError):
        return NetworkError(f"{repo}: no such repository on the Hugging Face Hub "
                            "(or it is private: set HF_TOKEN)")
    if isinstance(e, errors.EntryNotFoundError):
        return NetworkError(f"{what}: no such file on the Hugging Face Hub")
    if isinstance(e, errors.RevisionNotFoundError):
        return NetworkError(f"{what}: no such revision on the Hugging Face Hub")
    if isinstance(e, errors.OfflineModeIsEnabled):
        return NetworkError(f"{what} is not in the cache and HF_HUB_OFFLINE is set")
    if isinstance(e, errors.HfHubHTTPError):
        status = getattr(getattr(e, "response", None), "status_code", "?")
        return NetworkError(f"{what}: the Hugging Face Hub answered HTTP {status}")
    if isinstance(e, OSError) and getattr(e, "errno", None) == 28:
        from infer.runtime.errors import ResourceError

        return ResourceError(f"{what}: no space left on the disk holding the Hugging Face cache")
    return NetworkError(f"{what}: download failed: {type(e).__name__}: {e}")


def _cached_snapshot(repo: str) -> Path | None:
    from huggingface_hub import constants

    folder = Path(constants.HF_HUB_CACHE) / ("models--" + repo.replace("/", "--"))
    try:
        commit = (folder / "refs" / "main").read_text().strip()
    except OSError:
        return None
    snapshot = folder / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None


def _progress_class(filename: str, progress: Progress | None) -> Any:
    """A tqdm class for huggingface_hub that reports to `progress` (or stays silent)."""
    from huggingface_hub.utils import tqdm as hf_tqdm

    class Report(hf_tqdm):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)
            self._done = int(kwargs.get("initial", 0) or 0)
            self._total = int(kwargs.get("total", 0) or 0)

        def update(self, n: float | None = 1) -> bool | None:
            self._done += int(n or 0)
            if progress is not None:
                progress(filename, self._done, self._total)
            return None

    return Report
