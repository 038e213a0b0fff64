"""What native code writes straight to file descriptor 2, captured (``native_stderr_captured``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass


@dataclass
class CapturedText:
    text: str = ""


@contextmanager
def native_stderr_captured() -> Iterator[CapturedText]:
    """Capture what native code writes straight to file descriptor 2 (not through the log).

    llama.cpp's grammar parser reports errors with fprintf(stderr); this keeps them off
    the user's terminal and lets the caller put them into one clear message.
    """
    import tempfile

    captured = CapturedText()
    with suppress(OSError, ValueError):
        sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield captured
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            captured.text = tmp.read().decode("utf-8", "replace")
