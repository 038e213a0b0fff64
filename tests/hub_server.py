"""A small Hugging Face Hub look-alike HTTP server, for tests that run `huggingface_hub` offline.

``HubServer`` serves model repos held in memory on ``127.0.0.1`` (a free port), from a background
thread, with the routes and headers that ``huggingface_hub`` 2.4.0 reads:

* ``HEAD``/``GET /{repo_id}/resolve/{revision}/{filename}`` (``hf_hub_download``, ``get_hf_file_metadata``,
  ``file_exists``): ``X-Repo-Commit``, ``ETag`` (git blob sha1, or the sha256 for LFS files), for LFS files
  also ``X-Linked-Etag`` (the sha256) and ``X-Linked-Size``, ``Content-Length``, ``Accept-Ranges: bytes``;
  ``GET`` honours one ``Range: bytes=N-`` / ``bytes=N-M`` with ``206`` and ``Content-Range``. LFS files are
  served directly (no redirect to a CDN host): the client handles a ``200`` as well.
* ``GET /api/models/{repo_id}`` and ``/api/models/{repo_id}/revision/{revision}`` (``model_info``,
  ``repo_info``, ``repo_exists``, ``snapshot_download``); with ``?blobs=true`` (``files_metadata=True``) the
  siblings carry ``size``, ``blobId`` and ``lfs: {sha256, size, pointerSize}``.
* ``GET /api/models/{repo_id}/tree/{revision}[/{path}][?recursive=true]`` (``list_repo_tree``,
  ``list_repo_files``, ``snapshot_download``): entries ``{type, path, size, oid, lfs: {oid, size,
  pointerSize}}``, in one page (no ``Link`` header).
* ``GET /api/agent-harnesses``: an empty registry (``build_hf_headers`` fetches it once per process unless
  telemetry is disabled).

Errors carry the ``X-Error-Code`` / ``X-Error-Message`` headers that ``hf_raise_for_status`` maps to
exceptions: unknown repo -> 404 ``RepoNotFound`` (``RepositoryNotFoundError``), unknown revision -> 404
``RevisionNotFound`` (``RevisionNotFoundError``), unknown file -> 404 ``EntryNotFound`` with ``X-Repo-Commit``
(``RemoteEntryNotFoundError``; the client then caches the absence under ``.no_exist``), gated repo without an
allowed ``Authorization: Bearer`` token -> 401 ``GatedRepo`` (``GatedRepoError``), for every route of that
repo (the real Hub shows ``model_info`` of a gated repo to anyone; only file downloads are refused).

Pointing ``huggingface_hub`` at the server. It reads ``HF_ENDPOINT``, ``HF_HOME``, ``HF_HUB_CACHE``,
``HF_HUB_OFFLINE``, ``HF_HUB_DISABLE_TELEMETRY`` and ``HF_TOKEN_PATH`` once, when it is first imported (into
``huggingface_hub.constants``), so in-process tests must patch those constants, not (only) the environment:

* ``constants.ENDPOINT`` and ``constants.HUGGINGFACE_CO_URL_TEMPLATE`` (``ENDPOINT +
  "/{repo_id}/resolve/{revision}/{filename}"``): then ``hf_hub_download`` and any ``HfApi()`` created
  afterwards use the server. The module-level shortcuts (``huggingface_hub.model_info``,
  ``list_repo_files``, ...) are methods of an ``HfApi`` built at import time and keep the old endpoint:
  use ``HfApi(endpoint=hub.endpoint)``. Alternatively pass ``endpoint=hub.endpoint`` to every call.
* ``constants.HF_HUB_CACHE`` (or pass ``cache_dir=``), ``constants.HF_HOME``, ``constants.HF_TOKEN_PATH``
  (so no stored token leaks in; also unset ``HF_TOKEN``, which is read at call time).
* ``constants.HF_HUB_OFFLINE`` (``is_offline_mode()`` returns it) to test offline mode.
* ``constants.HF_HUB_DISABLE_TELEMETRY = True``, or the first request of the process also fetches
  ``{ENDPOINT}/api/agent-harnesses`` (served here with an empty registry).

Subprocesses (e.g. the ``infer`` CLI) import ``huggingface_hub`` afresh, so for them setting the
environment variables ``HF_ENDPOINT``, ``HF_HOME``, ``HF_HUB_CACHE``, ``HF_HUB_DISABLE_TELEMETRY=1`` (and
``HF_HUB_OFFLINE=1``) is enough.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import http.server
import json
import pathlib
import re
import socket
import struct
import sys
import threading
from types import TracebackType
from urllib.parse import parse_qs, unquote, urlsplit

_LFS_POINTER = "version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n"
_DATE = "2024-01-01T00:00:00.000Z"
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+(?:/[^/]+)?)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_API_MODEL = re.compile(
    r"^/api/models/(?P<repo>[^/]+(?:/[^/]+)?)"
    r"(?:/revision/(?P<rev>[^/]+)|/tree/(?P<tree_rev>[^/]+)(?:/(?P<tree_path>.+))?)?$"
)
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob holding `data` (what the Hub uses as the ETag of a regular file)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclasses.dataclass(frozen=True)
class _File:
    """One file of a commit. `data` is what GET serves; the other fields describe the original content."""

    data: bytes
    size: int
    blob_id: str  # git blob sha1 of the content, or of the LFS pointer for an LFS file
    sha256: str | None = None  # LFS files only
    pointer_size: int | None = None  # LFS files only

    @property
    def etag(self) -> str:
        return self.sha256 or self.blob_id


@dataclasses.dataclass
class _Repo:
    head: str  # commit sha that "main" points to
    gated: bool
    commits: dict[str, dict[str, _File]]  # every commit ever added -> its files


class _HubError(Exception):
    """An HTTP error answered with the Hub's error headers."""

    def __init__(self, status: int, code: str | None, message: str, commit: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.commit = status, code, message, commit


class HubServer:
    """An in-memory Hub serving model repos on 127.0.0.1; use as ``with HubServer() as hub: ...``.

    Attributes:
        endpoint: ``http://127.0.0.1:<port>``, valid while the server runs.
        downloads: number of GET requests that sent file bytes (status 200 or 206, interrupted ones included),
            by ``(repo_id, filename)``.
        requests: ``(method, path)`` of every request, in order; the path is the raw request target, with the
            query string and %-escapes as sent.
        ranges: the ``Range`` header of every file GET that had one, in order.
    """

    def __init__(self) -> None:
        self.endpoint = ""
        self.downloads: collections.Counter[tuple[str, str]] = collections.Counter()
        self.requests: list[tuple[str, str]] = []
        self.ranges: list[str] = []
        self._lock = threading.Lock()
        self._repos: dict[str, _Repo] = {}
        self._tokens: dict[str, set[str]] = collections.defaultdict(set)
        self._cuts: dict[tuple[str, str], tuple[int, bool]] = {}
        self._generation = 0
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------------------------

    def start(self) -> HubServer:
        """Bind a free port on 127.0.0.1 and serve from a daemon thread."""
        self._httpd = _Server(("127.0.0.1", 0), _Handler, self)
        self.endpoint = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, name="hub-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and drop open keep-alive connections (the client's pool may still hold them)."""
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.close_connections()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join()
        self._httpd = self._thread = None

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- content ------------------------------------------------------------------------------------------

    def add_repo(
        self,
        repo_id: str,
        files: dict[str, bytes | pathlib.Path],
        *,
        gated: bool = False,
        lfs_min_size: int = 0,
    ) -> str:
        """Create a model repo, or replace its content with a new commit; return the commit sha (40 hex).

        Files of `lfs_min_size` bytes or more are LFS files (sha256, size and pointer metadata); smaller
        ones are regular git files. With `gated`, every request for the repo without an
        ``Authorization: Bearer <token>`` header naming a token given to `allow_token` gets a 401
        ``GatedRepo`` error. Earlier commits stay reachable by their sha; "main" moves to the new one.
        """
        snapshot: dict[str, _File] = {}
        for name, source in sorted(files.items()):
            if not name or name.startswith("/") or name.endswith("/"):
                raise ValueError(f"bad file name: {name!r}")
            data = source.read_bytes() if isinstance(source, pathlib.Path) else bytes(source)
            if len(data) >= lfs_min_size:
                sha256 = hashlib.sha256(data).hexdigest()
                pointer = _LFS_POINTER.format(sha256=sha256, size=len(data)).encode()
                snapshot[name] = _File(data, len(data), git_blob_sha1(pointer), sha256, len(pointer))
            else:
                snapshot[name] = _File(data, len(data), git_blob_sha1(data))
        with self._lock:
            self._generation += 1
            manifest = json.dumps([repo_id, self._generation, [(n, f.etag) for n, f in snapshot.items()]])
            commit = hashlib.sha1(manifest.encode()).hexdigest()
            repo = self._repos.get(repo_id)
            if repo is None:
                self._repos[repo_id] = _Repo(head=commit, gated=gated, commits={commit: snapshot})
            else:
                repo.head, repo.gated = commit, gated
                repo.commits[commit] = snapshot
        return commit

    def allow_token(self, repo_id: str, token: str) -> None:
        """Let requests with ``Authorization: Bearer <token>`` into the gated repo `repo_id`."""
        with self._lock:
            self._tokens[repo_id].add(token)

    def cut_next_download(
        self, repo_id: str, filename: str, after_bytes: int, *, reset: bool = False
    ) -> None:
        """Make the next GET of this file send only `after_bytes` bytes of its body, then drop the connection.

        By default the connection is closed normally (FIN) with the body short of its ``Content-Length``:
        ``httpx2`` raises ``RemoteProtocolError``, which ``huggingface_hub``'s ``http_get`` retries by
        itself, after one second, with ``Range: bytes=<after_bytes>-``, within the same call. With `reset`,
        the connection is reset (TCP RST): the client gets ``httpx2.ReadError``, which ``hf_hub_download``
        does not retry but raises. Later requests are served normally, Range requests included.
        """
        if after_bytes < 0:
            raise ValueError("after_bytes must be >= 0")
        with self._lock:
            self._file(repo_id, filename)
            self._cuts[(repo_id, filename)] = (after_bytes, reset)

    def tamper(self, repo_id: str, filename: str, new_bytes: bytes) -> None:
        """Serve `new_bytes` (same length) for this file of "main" from now on, with all metadata unchanged.

        ETag, X-Linked-Etag, X-Linked-Size and the model_info / tree entries keep describing the original
        content, as a corrupted mirror or CDN would.
        """
        with self._lock:
            repo = self._repos[repo_id]
            old = self._file(repo_id, filename)
            if len(new_bytes) != old.size:
                raise ValueError(f"tampered content must keep the size ({old.size} bytes)")
            repo.commits[repo.head][filename] = dataclasses.replace(old, data=bytes(new_bytes))

    def _file(self, repo_id: str, filename: str) -> _File:
        """The file of "main" (raises KeyError if unknown); call with the lock held."""
        repo = self._repos[repo_id]
        return repo.commits[repo.head][filename]

    # -- request handling (called from the handler threads) ------------------------------------------------

    def _log(self, method: str, path: str) -> None:
        with self._lock:
            self.requests.append((method, path))

    def _snapshot(
        self, repo_id: str, revision: str, authorization: str | None
    ) -> tuple[str, dict[str, _File]]:
        """Resolve `revision` of `repo_id` for a request, checking the gate; return (commit, files)."""
        with self._lock:
            repo = self._repos.get(repo_id)
            if repo is None:
                raise _HubError(404, "RepoNotFound", f"Repository {repo_id} not found.")
            if repo.gated:
                token = (authorization or "").removeprefix("Bearer ").strip()
                if token not in self._tokens[repo_id]:
                    raise _HubError(
                        401,
                        "GatedRepo",
                        f"Access to model {repo_id} is restricted. You must have access to it and be"
                        " authenticated to access it. Please log in.",
                    )
            commit = repo.head if revision == "main" else revision
            if commit not in repo.commits:
                raise _HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return commit, dict(repo.commits[commit])

    def _take_cut(self, repo_id: str, filename: str) -> tuple[int, bool] | None:
        with self._lock:
            return self._cuts.pop((repo_id, filename), None)

    def _count_download(self, repo_id: str, filename: str) -> None:
        with self._lock:
            self.downloads[(repo_id, filename)] += 1

    def _record_range(self, range_header: str) -> None:
        with self._lock:
            self.ranges.append(range_header)

    def _model_info(
        self, repo_id: str, commit: str, files: dict[str, _File], blobs: bool
    ) -> dict[str, object]:
        siblings: list[dict[str, object]] = []
        for name, f in files.items():
            sibling: dict[str, object] = {"rfilename": name}
            if blobs:
                sibling.update(size=f.size, blobId=f.blob_id)
                if f.sha256 is not None:
                    sibling["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": f.pointer_size}
            siblings.append(sibling)
        with self._lock:
            gated: str | bool = "auto" if self._repos[repo_id].gated else False
        return {
            "_id": commit[:24],
            "id": repo_id,
            "modelId": repo_id,
            "author": repo_id.split("/")[0] if "/" in repo_id else None,
            "sha": commit,
            "lastModified": _DATE,
            "createdAt": _DATE,
            "private": False,
            "gated": gated,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
            "spaces": [],
            "usedStorage": sum(f.size for f in files.values()),
        }


def _tree(files: dict[str, _File], path: str, recursive: bool) -> list[dict[str, object]]:
    """The entries of ``/api/models/{repo}/tree/{rev}/{path}``: folders first, then files, as the Hub does."""
    prefix = f"{path.strip('/')}/" if path.strip("/") else ""
    folders: set[str] = set()
    entries: list[dict[str, object]] = []
    for name, f in files.items():
        if not name.startswith(prefix):
            continue
        parts = name[len(prefix) :].split("/")
        for depth in range(1, len(parts) if recursive else min(len(parts), 2)):
            folders.add(prefix + "/".join(parts[:depth]))
        if len(parts) > 1 and not recursive:
            continue
        entry: dict[str, object] = {"type": "file", "oid": f.blob_id, "size": f.size, "path": name}
        if f.sha256 is not None:
            entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": f.pointer_size}
        entries.append(entry)
    if prefix and not entries and not folders:
        raise _HubError(404, "EntryNotFound", f"{path} does not exist on this revision")
    dirs = [
        {"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d}
        for d in sorted(folders)
    ]
    return dirs + entries


class _Server(http.server.ThreadingHTTPServer):
    """ThreadingHTTPServer that knows its HubServer and can drop its open connections."""

    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], handler: type[http.server.BaseHTTPRequestHandler], hub: HubServer
    ) -> None:
        self.hub = hub
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, handler)

    def handle_error(self, request: object, client_address: object) -> None:
        """Ignore clients that hang up (the default prints a traceback); report anything else."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]

    def close_connections(self) -> None:
        with self.connections_lock:
            for conn in self.connections:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the Hub; every response sets Content-Length
    server: _Server
    timeout = 30

    def setup(self) -> None:
        super().setup()
        with self.server.connections_lock:
            self.server.connections.add(self.connection)

    def finish(self) -> None:
        with self.server.connections_lock:
            self.server.connections.discard(self.connection)
        super().finish()

    def log_message(self, format: str, *args: object) -> None:
        """Silence the default logging to stderr."""

    def do_HEAD(self) -> None:
        self._dispatch(head=True)

    def do_GET(self) -> None:
        self._dispatch(head=False)

    def _dispatch(self, head: bool) -> None:
        hub = self.server.hub
        hub._log(self.command, self.path)
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        auth = self.headers.get("Authorization")
        try:
            if match := _RESOLVE.match(url.path):
                repo_id, revision, filename = (unquote(match[g]) for g in ("repo", "rev", "file"))
                commit, files = hub._snapshot(repo_id, revision, auth)
                if filename not in files:
                    raise _HubError(404, "EntryNotFound", f"{filename} does not exist on {revision}", commit)
                self._send_file(repo_id, filename, commit, files[filename], head)
            elif (match := _API_MODEL.match(url.path)) and not head:
                repo_id = unquote(match["repo"])
                if match["tree_rev"] is not None:
                    _, files = hub._snapshot(repo_id, unquote(match["tree_rev"]), auth)
                    recursive = query.get("recursive", "").lower() in ("true", "1")
                    self._send_json(_tree(files, unquote(match["tree_path"] or ""), recursive))
                else:
                    commit, files = hub._snapshot(repo_id, unquote(match["rev"] or "main"), auth)
                    blobs = query.get("blobs", "").lower() in ("true", "1")
                    self._send_json(hub._model_info(repo_id, commit, files, blobs))
            elif url.path == "/api/agent-harnesses" and not head:
                self._send_json({"standardEnvVars": [], "harnesses": {}})
            else:
                raise _HubError(404, None, f"Not found: {url.path}")
        except _HubError as error:
            self._send_error(error)

    def _send_json(self, payload: object, status: int = 200, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_error(self, error: _HubError) -> None:
        headers = {"X-Error-Message": error.message.encode("ascii", "backslashreplace").decode()}
        if error.code is not None:
            headers["X-Error-Code"] = error.code
        if error.commit is not None:
            headers["X-Repo-Commit"] = error.commit
        self._send_json({"error": error.message}, error.status, headers)

    def _send_file(self, repo_id: str, filename: str, commit: str, f: _File, head: bool) -> None:
        hub = self.server.hub
        total = len(f.data)
        start, end = 0, total - 1
        range_header = None if head else self.headers.get("Range")
        if range_header is not None:
            hub._record_range(range_header)
            match = _RANGE.match(range_header.strip())
            start = int(match[1]) if match else total
            end = min(int(match[2]), total - 1) if match and match[2] else total - 1
            if start > end:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{total}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        self.send_response(206 if range_header is not None else 200)
        self.send_header("X-Repo-Commit", commit)
        self.send_header("ETag", f'"{f.etag}"')
        if f.sha256 is not None:
            self.send_header("X-Linked-Etag", f'"{f.sha256}"')
            self.send_header("X-Linked-Size", str(f.size))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        if range_header is not None:
            self.send_header("Content-Range", f"bytes {start}-{end}/{total}")
        self.send_header("Content-Length", str(end + 1 - start))
        self.end_headers()
        if head:
            return
        hub._count_download(repo_id, filename)
        body = f.data[start : end + 1]
        cut = hub._take_cut(repo_id, filename)
        if cut is None:
            self.wfile.write(body)
            return
        after_bytes, reset = cut
        self.wfile.write(body[:after_bytes])
        self.wfile.flush()
        self.close_connection = True
        if reset:
            # Linger 0: closing sends RST instead of FIN. The socket only really closes once rfile is closed.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.rfile.close()
            self.connection.close()
