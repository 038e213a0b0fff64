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


def models_dir() -> Path:
    """Where `infer quantize` and first-use conversions write their GGUF files."""
    return infer_home() / "models"


def known_output(reference: str) -> Path | None:
    """A model `infer quantize` wrote, by its name (with or without .gguf, any case).

    Here rather than beside the converter: every alias and Hub reference asks this
    first, and the converter's imports (gguf, numpy) would cost each run 80 ms."""
    folder = models_dir()
    if not folder.is_dir() or "/" in reference or "\\" in reference:
        return None
    wanted = reference.lower().removesuffix(".gguf")
    for path in folder.glob("*.gguf"):
        if path.stem.lower() == wanted:
            return path
    return None
