"""Model references: from what the user typed to a checked local GGUF file.

Resolution order (each kind slots in here):
1. a path to a ``.gguf`` file (or the first part of a split GGUF);
2. a path to a Hugging Face model folder (conversion comes with ``infer quantize``);
3. an alias from ``models.toml`` and 4. a Hub reference ``owner/repo[:QUANT]``
   (both come with the Hub issue).
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from infer.quant.atomic import write_atomic
from infer.quant.gguf_check import check_gguf
from infer.quant.paths import infer_home
from infer.runtime.errors import ModelError, ModelNotFoundError

_SPLIT_PART = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
_MEMO_NAME = "checked-gguf.json"
_MEMO_MAX = 512


@dataclass(frozen=True)
class ResolvedModel:
    """A local GGUF file ready for the runtime, and what the user called it."""

    reference: str
    path: Path


def resolve_model(reference: str) -> ResolvedModel:
    """Turn a model reference into a checked local GGUF file, or raise a ModelError."""
    path = Path(reference).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            raise ModelError(
                f"{reference}: Hugging Face model folders are not supported yet; "
                "give a .gguf file"
            )
        raise ModelNotFoundError(f"{reference}: is a folder, not a GGUF model file")
    if path.is_file() or reference.endswith(".gguf"):
        if not path.exists():
            raise ModelNotFoundError(f"{reference}: no such file")
        split = _SPLIT_PART.search(path.name)
        if split and split.group(1) != "00001":
            raise ModelError(
                f"{reference}: this is part {int(split.group(1))} of a split GGUF; "
                f"give the first part (-00001-of-{split.group(2)}.gguf)"
            )
        verify_gguf(path)
        return ResolvedModel(reference, path.resolve())
    raise ModelNotFoundError(
        f"{reference}: no such model file (model aliases and Hub references are not supported yet)"
    )


def verify_gguf(path: Path) -> None:
    """Check `path` strictly, unless this very file (same size, mtime, inode) passed before.

    The full check walks every vocabulary string (about 0.1 s for a 128k vocabulary),
    too much to repeat on every one-shot run of an unchanged file.
    """
    st = path.stat()
    stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
    key = str(path.resolve())
    memo_path = infer_home() / _MEMO_NAME
    memo = _read_memo(memo_path)
    if memo.get(key) == stamp:
        return
    check_gguf(path)
    memo.pop(key, None)
    memo[key] = stamp
    while len(memo) > _MEMO_MAX:
        memo.pop(next(iter(memo)))
    with contextlib.suppress(OSError):  # a read-only home only costs the next run a full check
        write_atomic(memo_path, json.dumps(memo).encode())


def _read_memo(memo_path: Path) -> dict[str, list[int]]:
    try:
        data = json.loads(memo_path.read_bytes())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
