"""Writing files so that an interrupted write never leaves a partial file under the final name."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path


def write_atomic(path: Path, data: bytes | Iterable[bytes]) -> None:
    """Write `data` (bytes, or parts written one after another) to a temporary file
    beside `path`, then rename it into place."""
    import tempfile  # not needed on the common path, where nothing is written

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            for part in [data] if isinstance(data, bytes) else data:
                f.write(part)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
