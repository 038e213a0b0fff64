"""The real huggingface_hub client against tests/hub_server.py, on 127.0.0.1 only."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from hub_server import HubServer, git_blob_sha1
from huggingface_hub import (
    HfApi,
    constants,
    hf_hub_download,
    snapshot_download,
    try_to_load_from_cache,
)
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import _CACHED_NO_EXIST

REPO = "tester/tiny-model"
WEIGHTS = os.urandom(4096)  # an LFS file with lfs_min_size=1024
CONFIG = b'{"n_layer": 2}\n'  # a regular git file
NESTED = b"x" * 2000


@pytest.fixture
def hub() -> Iterator[HubServer]:
    with HubServer() as server:
        yield server


@pytest.fixture
def cache(hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point huggingface_hub at `hub`, with its home and cache in tmp_path; return the hub cache folder.

    huggingface_hub copies these environment variables into `huggingface_hub.constants` when it is first
    imported, so the constants are patched too; the environment only serves subprocesses.
    """
    home = tmp_path / "hf"
    cache = home / "hub"
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE", "HF_HUB_OFFLINE",
                 "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    env = {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(home), "HF_HUB_CACHE": str(cache)}
    for name, value in {**env, "HF_HUB_DISABLE_TELEMETRY": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)
    monkeypatch.setattr(
        constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    )
    monkeypatch.setattr(constants, "HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    return cache


def add_tiny_repo(hub: HubServer, **kwargs: bool) -> str:
    files: dict[str, bytes | Path] = {
        "model.gguf": WEIGHTS,
        "config.json": CONFIG,
        "sub/dir/extra.bin": NESTED,
    }
    return hub.add_repo(REPO, files, lfs_min_size=1024, **kwargs)


def sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_download_lfs_and_regular_files_then_use_the_cache(hub: HubServer, cache: Path) -> None:
    commit = add_tiny_repo(hub)

    weights = hf_hub_download(REPO, "model.gguf")
    config = hf_hub_download(REPO, "config.json")

    snapshot = cache / "models--tester--tiny-model" / "snapshots" / commit
    assert Path(weights) == snapshot / "model.gguf"
    assert Path(weights).read_bytes() == WEIGHTS
    assert Path(config).read_bytes() == CONFIG
    # Blobs are named by the ETag: sha256 for LFS files, git blob sha1 for regular ones.
    assert Path(weights).resolve().name == hashlib.sha256(WEIGHTS).hexdigest()
    assert Path(config).resolve().name == git_blob_sha1(CONFIG)
    assert (cache / "models--tester--tiny-model" / "refs" / "main").read_text() == commit

    # Again: a HEAD call to check the ETag, no download.
    assert hf_hub_download(REPO, "model.gguf") == weights
    assert hf_hub_download(REPO, "config.json") == config
    assert hub.downloads == {(REPO, "model.gguf"): 1, (REPO, "config.json"): 1}
    assert hub.requests[-1] == ("HEAD", "/tester/tiny-model/resolve/main/config.json")

    # Pinned to the commit sha and cached: no request at all.
    count = len(hub.requests)
    assert hf_hub_download(REPO, "model.gguf", revision=commit) == weights
    assert len(hub.requests) == count


def test_model_info_lists_files_metadata(hub: HubServer, cache: Path) -> None:
    commit = add_tiny_repo(hub)
    api = HfApi(endpoint=hub.endpoint)

    info = api.model_info(REPO, files_metadata=True)

    assert info.id == REPO and info.sha == commit and info.private is False and info.gated is False
    siblings = {s.rfilename: s for s in info.siblings or []}
    assert set(siblings) == {"model.gguf", "config.json", "sub/dir/extra.bin"}
    weights = siblings["model.gguf"]
    assert weights.size == len(WEIGHTS)
    assert weights.lfs is not None
    assert weights.lfs.sha256 == hashlib.sha256(WEIGHTS).hexdigest()
    assert weights.lfs.size == len(WEIGHTS)
    assert siblings["config.json"].lfs is None
    assert siblings["config.json"].blob_id == git_blob_sha1(CONFIG)
    assert siblings["config.json"].size == len(CONFIG)

    plain = api.model_info(REPO, revision=commit)
    assert plain.sha == commit
    assert [s.size for s in plain.siblings or []] == [None, None, None]


def test_list_repo_files_and_tree(hub: HubServer, cache: Path) -> None:
    add_tiny_repo(hub)
    api = HfApi(endpoint=hub.endpoint)

    assert sorted(api.list_repo_files(REPO)) == ["config.json", "model.gguf", "sub/dir/extra.bin"]

    top = {entry.path: entry for entry in api.list_repo_tree(REPO)}
    assert set(top) == {"sub", "config.json", "model.gguf"}
    weights = top["model.gguf"]
    assert getattr(weights, "lfs", None) is not None
    assert weights.lfs.sha256 == hashlib.sha256(WEIGHTS).hexdigest()  # type: ignore[union-attr]
    assert [e.path for e in api.list_repo_tree(REPO, path_in_repo="sub")] == ["sub/dir"]


def test_snapshot_download(hub: HubServer, cache: Path) -> None:
    commit = add_tiny_repo(hub)

    folder = Path(snapshot_download(REPO))

    assert folder == cache / "models--tester--tiny-model" / "snapshots" / commit
    assert (folder / "sub" / "dir" / "extra.bin").read_bytes() == NESTED
    assert (folder / "model.gguf").read_bytes() == WEIGHTS
    assert ("GET", f"/api/models/{REPO}/tree/{commit}?recursive=true&expand=false") in hub.requests


def test_unknown_repo_revision_and_file(hub: HubServer, cache: Path) -> None:
    add_tiny_repo(hub)

    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("tester/missing", "model.gguf")
    with pytest.raises(RepositoryNotFoundError):
        HfApi(endpoint=hub.endpoint).model_info("tester/missing")
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(REPO, "model.gguf", revision="v9")
    with pytest.raises(RemoteEntryNotFoundError) as error:
        hf_hub_download(REPO, "missing.gguf")
    assert isinstance(error.value, EntryNotFoundError)
    # The 404 carried X-Repo-Commit, so the client cached the absence of the file.
    assert try_to_load_from_cache(REPO, "missing.gguf") is _CACHED_NO_EXIST


def test_gated_repo_needs_an_allowed_token(hub: HubServer, cache: Path) -> None:
    add_tiny_repo(hub, gated=True)
    hub.allow_token(REPO, "hf_good")
    api = HfApi(endpoint=hub.endpoint)

    with pytest.raises(GatedRepoError):
        hf_hub_download(REPO, "model.gguf")
    with pytest.raises(GatedRepoError):
        hf_hub_download(REPO, "model.gguf", token="hf_wrong")
    with pytest.raises(GatedRepoError):
        api.model_info(REPO, token=False)
    assert not hub.downloads

    path = hf_hub_download(REPO, "model.gguf", token="hf_good")
    assert Path(path).read_bytes() == WEIGHTS
    assert api.model_info(REPO, token="hf_good").gated == "auto"

    # Once cached, a refused HEAD (401) falls back to the cached file silently.
    assert hf_hub_download(REPO, "model.gguf") == path


@pytest.mark.parametrize(
    ("chunk_size", "ranges"),
    [(512, ["bytes=1024-"]), (constants.DOWNLOAD_CHUNK_SIZE, [])],
    ids=["small-chunks", "default-10MB-chunks"],
)
def test_interrupted_download_is_retried_within_the_same_call(
    hub: HubServer, cache: Path, monkeypatch: pytest.MonkeyPatch, chunk_size: int, ranges: list[str]
) -> None:
    add_tiny_repo(hub)
    hub.cut_next_download(REPO, "model.gguf", after_bytes=1024)
    # http_get reads the body in chunks of DOWNLOAD_CHUNK_SIZE (10 MB) and only counts (and writes)
    # whole chunks: what it received of an incomplete chunk is lost, and a retry resumes after the last
    # whole chunk, or restarts without a Range header when there is none.
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", chunk_size)

    # The body ends early (FIN): http_get retries by itself, after sleeping 1 s.
    path = hf_hub_download(REPO, "model.gguf")

    assert Path(path).read_bytes() == WEIGHTS
    assert hub.downloads[(REPO, "model.gguf")] == 2
    assert hub.ranges == ranges


def test_reset_download_raises_and_the_next_call_starts_over(hub: HubServer, cache: Path) -> None:
    add_tiny_repo(hub)
    hub.cut_next_download(REPO, "model.gguf", after_bytes=1000, reset=True)
    blobs = cache / "models--tester--tiny-model" / "blobs"

    # A connection reset (RST) is not retried: httpx2.ReadError escapes hf_hub_download, unwrapped,
    # and the partial file (blobs/<etag>.<random>.incomplete) is deleted.
    with pytest.raises(httpx2.ReadError):
        hf_hub_download(REPO, "model.gguf")
    assert list(blobs.iterdir()) == []
    assert try_to_load_from_cache(REPO, "model.gguf") is None

    path = hf_hub_download(REPO, "model.gguf")

    assert Path(path).read_bytes() == WEIGHTS
    assert hub.downloads[(REPO, "model.gguf")] == 2
    assert hub.ranges == []  # nothing to resume from: the second call downloads from byte 0


def test_range_requests(hub: HubServer, cache: Path) -> None:
    add_tiny_repo(hub)
    url = f"{hub.endpoint}/{REPO}/resolve/main/model.gguf"

    response = httpx2.get(url, headers={"Range": "bytes=4000-"})
    assert response.status_code == 206
    assert response.headers["Content-Range"] == "bytes 4000-4095/4096"
    assert response.content == WEIGHTS[4000:]
    assert httpx2.get(url, headers={"Range": "bytes=5000-"}).status_code == 416


def test_tampered_content_does_not_match_the_metadata(hub: HubServer, cache: Path) -> None:
    add_tiny_repo(hub)
    hub.tamper(REPO, "model.gguf", bytes(len(WEIGHTS)))

    path = hf_hub_download(REPO, "model.gguf")

    info = HfApi(endpoint=hub.endpoint).model_info(REPO, files_metadata=True)
    lfs = next(s.lfs for s in info.siblings or [] if s.rfilename == "model.gguf")
    assert lfs is not None and lfs.sha256 == hashlib.sha256(WEIGHTS).hexdigest()
    # hf_hub_download does not check the sha256: the blob is named after it but holds other bytes.
    assert Path(path).read_bytes() == bytes(len(WEIGHTS))
    assert sha256(path) != lfs.sha256
    assert Path(path).resolve().name == lfs.sha256


def test_offline_mode_uses_the_cache_without_requests(
    hub: HubServer, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_tiny_repo(hub)
    path = hf_hub_download(REPO, "model.gguf")
    count = len(hub.requests)

    # HF_HUB_OFFLINE is read at import time: patch the constant (is_offline_mode() returns it).
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)

    assert try_to_load_from_cache(REPO, "model.gguf") == path
    assert hf_hub_download(REPO, "model.gguf", local_files_only=True) == path
    assert hf_hub_download(REPO, "model.gguf") == path
    with pytest.raises(LocalEntryNotFoundError):
        hf_hub_download(REPO, "config.json")
    with pytest.raises(OfflineModeIsEnabled):
        HfApi(endpoint=hub.endpoint).model_info(REPO)
    assert len(hub.requests) == count


def test_explicit_endpoint_and_cache_dir_without_patching_the_endpoint(
    hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the `cache` fixture: endpoint=, cache_dir= and token=False on every call are enough."""
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)  # else one request to the real ENDPOINT
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert hub.endpoint != constants.ENDPOINT
    add_tiny_repo(hub)

    path = hf_hub_download(REPO, "config.json", endpoint=hub.endpoint, cache_dir=tmp_path, token=False)

    assert Path(path).read_bytes() == CONFIG
    assert Path(path).is_relative_to(tmp_path)
    assert hub.requests == [
        ("HEAD", "/tester/tiny-model/resolve/main/config.json"),
        ("GET", "/tester/tiny-model/resolve/main/config.json"),
    ]
