"""Where infer keeps its own files: one home folder, ``$INFER_HOME``, and every path in it.

This module names the layout of that folder; everything else asks it for a path. The
runtime takes its paths from the caller (``runtime.repack.remember_in(repack_memo)``,
``runtime.template.use_compiled_cache(template_cache_dir())``) and never imports this.

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


# -- models ------------------------------------------------------------------------------

def models_dir() -> Path:
    """Where `infer quantize` and first-use conversions write their GGUF files."""
    return infer_home() / "models"


def user_catalog() -> Path:
    """The user's models.toml, laid over the shipped one (quant/catalog.py)."""
    return infer_home() / "models.toml"


def checked_gguf_memo() -> Path:
    """The GGUF files that passed the strict check, by size, mtime and inode (quant/registry.py)."""
    return infer_home() / "checked-gguf.json"


def last_used_memo() -> Path:
    """When each model last ran, for `infer list` (quant/store.py)."""
    return infer_home() / "last-used.json"


def layouts_memo() -> Path:
    """Each GGUF file's layout, read once per file (cli/placement.py)."""
    return infer_home() / "layouts.json"


def repack_memo() -> Path:
    """The repacking check's verdicts per llama.cpp build, CPU and kernel (runtime/repack.py)."""
    return infer_home() / "repack-check.json"


# -- caches ------------------------------------------------------------------------------

def prompt_cache_dir() -> Path:
    """KV states of long prompts (runtime/prompt_cache.py; `infer cache`)."""
    return infer_home() / "cache" / "prompts"


def template_cache_dir() -> Path:
    """Compiled chat templates (runtime/template.py)."""
    return infer_home() / "cache" / "templates"


def speculation_profiles() -> Path:
    """The cost profiles speculative decoding weighs its guesses with (cli/speculation.py)."""
    return infer_home() / "cache" / "speculation.json"


# -- conversations and the server ---------------------------------------------------------

def conversations_dir() -> Path:
    """What `infer run` said, for `infer run --continue` (cli/conversations.py)."""
    return infer_home() / "conversations"


def chat_history_dir() -> Path:
    """`infer chat`'s line-editor history, one file per model."""
    return infer_home() / "history"


def chat_sessions_dir() -> Path:
    """`infer chat`'s saved sessions (/save, /load), one folder per name."""
    return infer_home() / "sessions"


def server_socket() -> Path:
    """The Unix socket `infer serve` also listens on, for its user alone."""
    return infer_home() / "serve.sock"


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
