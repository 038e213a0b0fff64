"""Where infer keeps its own files: one home folder, ``$INFER_HOME``.

Downloaded models stay in the standard Hugging Face cache (``HF_HOME``,
``HF_HUB_CACHE``), which huggingface_hub resolves itself.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def infer_home() -> Path:
    """$INFER_HOME, else the platform's user data folder (e.g. ~/.local/share/infer)."""
    env = os.environ.get("INFER_HOME")
    if env:
        return Path(env).expanduser()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "infer"
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(base) / "infer"
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "infer"
