"""The child side of `quantize` (quant/quantize.py): llama.cpp's quantizer in a process of its own.

Run as ``python -m infer.quant.quantize_child SRC DST FTYPE THREADS [IMATRIX]``. The
parent reads two things from it: its stderr, which carries llama.cpp's log (a line per
tensor, "[ i/ n] name ...", is progress; the last lines say what went wrong), and its exit
status (0: DST is complete; anything else: it failed, or llama.cpp aborted the process).

``quantize_file`` is the work and only returns a status. Everything that belongs to the
process rather than to the work (the default Ctrl-C, the log handler that makes stderr
the parent's channel, the exit status) is set in the ``__main__`` block at the end, the
one boundary here, as the CLI does for its own process.
"""

from __future__ import annotations

import ctypes
from pathlib import Path


def quantize_file(src: str, dst: str, ftype: int, threads: int, imatrix_file: str = "") -> int:
    """Quantize the GGUF `src` into `dst` as llama.cpp's file type `ftype` (with the importance
    matrix in `imatrix_file`, if any); llama.cpp's log goes to the "infer" loggers.
    0 when llama.cpp succeeded, 1 when it reported a failure."""
    from infer.runtime.llama import C, init_backend

    init_backend()
    params = C.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads
    keep = []  # the arrays the C side reads must outlive the call
    if imatrix_file:
        from infer.quant.imatrix import load_imatrix

        values = load_imatrix(Path(imatrix_file))
        entries = (C.llama_model_imatrix_data * (len(values) + 1))()  # zeroed terminator last
        for i, (name, data) in enumerate(values.items()):
            raw = data.astype("float32")
            keep += [name.encode(), raw]
            entries[i].name = keep[-2]
            entries[i].data = raw.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            entries[i].size = raw.size
        params.imatrix = entries
    rc = C.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    return 0 if rc == 0 else 1


if __name__ == "__main__":  # pragma: no cover - the child process's entry (see the module's docstring)
    import logging
    import signal
    import sys

    signal.signal(signal.SIGINT, signal.SIG_DFL)  # the parent cleans up; die at once
    handler = logging.StreamHandler(sys.stderr)  # llama.cpp's log: the parent's progress and error
    logging.getLogger("infer").addHandler(handler)
    logging.getLogger("infer").setLevel(logging.INFO)
    args = sys.argv[1:]
    status = quantize_file(args[0], args[1], int(args[2]), int(args[3]), args[4] if len(args) > 4 else "")
    sys.stderr.flush()
    sys.exit(status)
