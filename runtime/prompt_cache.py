"""KV states of prompt prefixes on disk, shared by every infer process.

Layout: ``FOLDER/<binding>/<prefix>.kv``. ``<binding>`` hashes everything that makes
a state valid (`Session.fingerprint()`: the model file's content, the context size,
the KV cache types, flash attention, llama.cpp's build); ``<prefix>`` hashes the
token prefix the state holds. A file is a magic string, a JSON header (the tokens,
the model's name, the state's size and SHA-256) and the state.

Files are written to a temporary name and renamed into place, and read without
locks: processes never wait for each other, and a reader sees a whole file or none.
A file whose header or checksum does not hold is removed and ignored. The last use
is the file's mtime; when the cache is over its cap, the least recently used
entries are removed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from infer.runtime.atomic import write_atomic
from infer.runtime.log import logger
from infer.runtime.session import common_prefix_len

MAGIC = b"INFERKV1"
# A state is worth saving, and a cached prefix worth loading, from this many tokens.
MIN_TOKENS = 256
DEFAULT_MAX_BYTES = 2 * 1024**3
_HEADER_LEN = struct.Struct("<I")


@dataclass(frozen=True)
class CacheEntry:
    path: Path
    model: str
    model_digest: str  # Session.fingerprint()'s digest of the model file
    n_tokens: int
    size: int  # bytes on disk
    last_used: float  # seconds since the epoch


def binding_key(fingerprint: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:24]


def prefix_key(tokens: Sequence[int]) -> str:
    return hashlib.sha256(struct.pack(f"<{len(tokens)}i", *tokens)).hexdigest()[:32]


class StateHolder(Protocol):
    """What holds one sequence's KV state: a `Session`, or a slot of the scheduler."""

    def fingerprint(self) -> dict[str, object]: ...

    def save_state(self) -> tuple[list[int], bytes]: ...

    def restore_state(self, tokens: list[int], data: bytes) -> bool: ...


class PromptCache:
    """The cache in `folder`, kept under `max_bytes`; prefixes shorter than `min_tokens` are skipped."""

    def __init__(self, folder: Path, *, max_bytes: int = DEFAULT_MAX_BYTES,
                 min_tokens: int = MIN_TOKENS) -> None:
        self.folder = folder
        self.max_bytes = max_bytes
        self.min_tokens = min_tokens
        self._writers: list[threading.Thread] = []
        # Headers read before, by path, with the (mtime, size) they were read at: a server looks
        # for a prefix on every long new prompt, and a file is opened again only when it changed.
        self._headers: dict[Path, tuple[tuple[int, int], dict[str, Any]]] = {}

    def restore(self, session: StateHolder, tokens: Sequence[int], *, min_tokens: int | None = None,
                max_tokens: int | None = None) -> int:
        """Load into `session` the cached state that shares the longest prefix with `tokens`.

        Returns the length of that shared prefix (0 when no entry shares at least
        `min_tokens`, by default the cache's threshold). The
        session's KV cache then holds the entry's tokens; its next prefill keeps the
        shared prefix and drops the rest. Entries of more than `max_tokens` tokens
        (more than the session has room for) are passed over.
        """
        folder = self.folder / binding_key(session.fingerprint())
        candidates = []
        for path in _kv_files(folder):
            header = self._header(path)
            if header is None:
                continue
            if max_tokens is not None and len(header["tokens"]) > max_tokens:
                continue
            shared = common_prefix_len(header["tokens"], tokens)
            if shared >= max(self.min_tokens if min_tokens is None else min_tokens, 1):
                candidates.append((shared, path, header))
        for shared, path, header in sorted(candidates, key=lambda c: -c[0]):
            state = _read_state(path, header)
            if state is not None and session.restore_state(list(header["tokens"]), state):
                _touch(path)
                return shared
            self._forget(path)  # llama.cpp refused it: no use keeping it
        return 0

    def store(self, session: StateHolder, model_name: str, *, min_tokens: int | None = None,
              wait: bool = True) -> None:
        """Save the session's KV state (all the tokens it holds) unless it is cached already.

        States shorter than the threshold are not saved. The state is copied at once;
        with ``wait=False`` the file is written by a background thread (`flush` waits
        for it), so that saving a prefix does not delay the reply. The cache is best
        effort: a write that fails (a full disk) is logged and forgotten.
        """
        tokens, state = session.save_state()
        if len(tokens) < (self.min_tokens if min_tokens is None else min_tokens) or not state:
            return
        binding = session.fingerprint()
        path = self.folder / binding_key(binding) / f"{prefix_key(tokens)}.kv"
        args = (path, {"model": model_name, "binding": binding, "tokens": tokens}, state)
        if wait:
            self._write(*args)
        else:
            writer = threading.Thread(target=self._write, args=args, name="infer-prompt-cache")
            writer.start()
            self._writers = [w for w in self._writers if w.is_alive()] + [writer]

    def flush(self) -> None:
        """Wait for the background writes."""
        while self._writers:
            self._writers.pop().join()

    def _write(self, path: Path, about: dict[str, Any], state: bytes) -> None:
        if _read_header(path) is not None:
            _touch(path)
            return
        header = json.dumps({"version": 1, **about, "size": len(state),
                             "sha256": hashlib.sha256(state).hexdigest(), "created": time.time()})
        try:
            write_atomic(path, [MAGIC, _HEADER_LEN.pack(len(header)), header.encode(), state])
            self.evict()
        except OSError as e:
            logger("infer.prompt_cache").warning("prompt cache: cannot write %s (%s)", path, e)

    def entries(self) -> list[CacheEntry]:
        """Every readable entry, most recently used first."""
        out = []
        for path in _kv_files(self.folder, all_bindings=True):
            header = self._header(path)
            if header is None:
                continue
            try:
                st = path.stat()
            except OSError:
                continue
            binding = header.get("binding") or {}
            out.append(CacheEntry(path, str(header.get("model", "?")), str(binding.get("model_digest", "")),
                                  len(header["tokens"]), st.st_size, st.st_mtime))
        return sorted(out, key=lambda e: -e.last_used)

    def evict(self) -> list[CacheEntry]:
        """Remove the least recently used entries until the cache fits its cap; the removed."""
        for tmp in self.folder.glob("*/.*.tmp"):  # left by a writer that was killed
            with contextlib.suppress(OSError):
                if tmp.stat().st_mtime < time.time() - 3600:
                    tmp.unlink()
        entries = self.entries()
        total = sum(e.size for e in entries)
        removed = []
        while entries and total > self.max_bytes:
            oldest = entries.pop()
            self._forget(oldest.path)
            total -= oldest.size
            removed.append(oldest)
        return removed

    def _header(self, path: Path) -> dict[str, Any] | None:
        """`_read_header`, remembered while the file's mtime and size stay the same."""
        try:
            st = path.stat()
        except OSError:
            self._headers.pop(path, None)
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        known = self._headers.get(path)
        if known is not None and known[0] == stamp:
            return known[1]
        header = _read_header(path)
        if header is None:
            self._headers.pop(path, None)
        else:
            self._headers[path] = (stamp, header)
        return header

    def _forget(self, path: Path) -> None:
        _remove(path)
        self._headers.pop(path, None)

    def remove(self, entries: Sequence[CacheEntry]) -> None:
        for entry in entries:
            self._forget(entry.path)


def _kv_files(folder: Path, *, all_bindings: bool = False) -> Iterator[Path]:
    pattern = "*/*.kv" if all_bindings else "*.kv"
    try:
        yield from folder.glob(pattern)
    except OSError:
        return


def _read_header(path: Path) -> dict[str, Any] | None:
    """The entry's header if the file is whole and well formed; a broken file is removed."""
    try:
        with path.open("rb") as f:
            head = f.read(len(MAGIC) + _HEADER_LEN.size)
            if len(head) < len(MAGIC) + _HEADER_LEN.size or head[:len(MAGIC)] != MAGIC:
                raise ValueError("not a cache entry")
            (length,) = _HEADER_LEN.unpack(head[len(MAGIC):])
            header = json.loads(f.read(length))
            if not isinstance(header.get("tokens"), list) or not isinstance(header.get("size"), int):
                raise ValueError("bad header")
            header["offset"] = len(head) + length
            if path.stat().st_size != header["offset"] + header["size"]:
                raise ValueError("truncated")
            return header
    except FileNotFoundError:
        return None
    except (OSError, ValueError, UnicodeDecodeError, AttributeError):
        _remove(path)
        return None


def _read_state(path: Path, header: dict[str, Any]) -> bytes | None:
    """The state, if it still matches its checksum (otherwise the file is removed)."""
    try:
        with path.open("rb") as f:
            f.seek(header["offset"])
            state = f.read(header["size"])
    except OSError:
        return None
    if len(state) != header["size"] or hashlib.sha256(state).hexdigest() != header.get("sha256"):
        _remove(path)
        return None
    return state


def _touch(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.utime(path)


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()
