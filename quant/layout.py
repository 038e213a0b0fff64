"""A GGUF file's layout (what planning its memory needs), read from its header once per file
and remembered in INFER_HOME/layouts.json."""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict
from pathlib import Path

from infer.quant.paths import layouts_memo
from infer.runtime.atomic import write_atomic
from infer.runtime.memory_plan import ModelLayout

_LAYOUTS: dict[str, ModelLayout] = {}
_MEMO_MAX = 64


def model_layout(path: Path) -> ModelLayout:
    """The layout of the GGUF file at ``path``, remembered per file (path, size, mtime).

    Reading it walks the whole header (about 0.1 s for a 128k vocabulary), so it is
    kept in INFER_HOME/layouts.json for the next run of the same file.
    """
    key = str(Path(path).resolve())
    if key in _LAYOUTS:
        return _LAYOUTS[key]
    st = Path(key).stat()
    stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
    memo_path = layouts_memo()
    try:
        memo = json.loads(memo_path.read_bytes())
        if not isinstance(memo, dict):
            memo = {}
    except (OSError, ValueError):
        memo = {}
    entry = memo.get(key)
    layout = None
    if isinstance(entry, dict) and entry.get("stamp") == stamp:
        try:
            fields = entry["layout"]
            layout = ModelLayout(**{**fields, "layer_bytes": tuple(fields["layer_bytes"]),
                                    "n_head_kv": tuple(fields["n_head_kv"])})
        except (KeyError, TypeError):
            layout = None
    if layout is None:
        from infer.quant.gguf_check import check_gguf  # (not imported when the memo knows the file)

        info = check_gguf(key)
        layout = ModelLayout.from_gguf(info.metadata, ((t.name, t.shape, t.nbytes) for t in info.tensors))
        memo.pop(key, None)
        memo[key] = {"stamp": stamp, "layout": asdict(layout)}
        while len(memo) > _MEMO_MAX:
            memo.pop(next(iter(memo)))
        with contextlib.suppress(OSError):  # a read-only home only costs the next run a header read
            write_atomic(memo_path, json.dumps(memo).encode())
    _LAYOUTS[key] = layout
    return layout
