"""GGUF to GGUF with llama.cpp's own quantizer, run in a child process.

llama.cpp aborts the whole process on some internal failures; in a child that is an
error message, not a dead CLI. The child (quant/quantize_child.py) writes to a temporary
name beside the output; the parent renames it into place when the child succeeded and
removes it otherwise (Ctrl-C included). The child's stderr is llama.cpp's log: each
tensor's "[ i/ n]" line is progress, and the last lines say why it failed.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import gguf

from infer.runtime.errors import InferError, ResourceError, UsageError

# llama.cpp's file types by their usual names (the gguf package's LlamaFileType mirrors llama.h).
FILE_TYPES: dict[str, int] = {
    member.name.removeprefix("MOSTLY_").removeprefix("ALL_"): int(member.value)
    for member in gguf.LlamaFileType if member.name != "GUESSED"
}
# Types llama.cpp will not make without an importance matrix.
NEEDS_IMATRIX = frozenset({"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S"})
_STEP = re.compile(r"\[\s*(\d+)/\s*(\d+)\]\s+(\S+)")

# progress(tensor_name, index, count)
Progress = Callable[[str, int, int], None]


def file_type(name: str, *, imatrix: Path | None = None) -> tuple[str, int]:
    """The canonical name and llama.cpp number of a quant type given in any case."""
    key = name.upper()
    if key not in FILE_TYPES:
        raise UsageError(f"unknown quant type {name!r}; valid: {', '.join(FILE_TYPES)}")
    if key in NEEDS_IMATRIX and imatrix is None:
        raise UsageError(f"{key} needs an importance matrix (--imatrix FILE)")
    return key, FILE_TYPES[key]


def quantize(src: Path, dst: Path, quant: str, *, threads: int = 0, imatrix: Path | None = None,
             progress: Progress | None = None) -> Path:
    """Quantize the GGUF `src` to `quant` (with an importance matrix file), writing `dst` atomically."""
    name, ftype = file_type(quant, imatrix=imatrix)
    if imatrix is not None:
        from infer.quant.imatrix import load_imatrix

        load_imatrix(imatrix)  # a bad file is the user's error, before the child starts
    tmp = dst.with_name(f".{dst.name}.partial")
    cmd = [sys.executable, "-m", "infer.quant.quantize_child",
           str(src), str(tmp), str(ftype), str(threads), str(imatrix or "")]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, errors="replace")
    last_lines: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            step = _STEP.search(line)
            if step and progress is not None:
                progress(step.group(3), int(step.group(1)), int(step.group(2)))
            last_lines = [*last_lines[-4:], line.strip()]
        code = proc.wait()
        if code != 0:
            detail = next((ln for ln in reversed(last_lines) if ln), f"exit status {code}")
            error = ResourceError if "No space" in detail else InferError
            raise error(f"quantizing to {name} failed: {detail}")
        tmp.replace(dst)
        return dst
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
        tmp.unlink(missing_ok=True)
        raise
