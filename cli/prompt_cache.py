"""The prompt cache on disk: where it is and how big it may grow (`infer cache` is cli/cache.py)."""

from __future__ import annotations

import os
import re
from typing import Any

from infer.runtime.errors import UsageError

SIZE_VARIABLE = "INFER_PROMPT_CACHE_SIZE"
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def open_cache() -> Any:
    """The prompt cache in INFER_HOME/cache/prompts, capped by INFER_PROMPT_CACHE_SIZE (default 2G)."""
    from infer.quant.paths import prompt_cache_dir
    from infer.runtime.prompt_cache import DEFAULT_MAX_BYTES, PromptCache

    size = os.environ.get(SIZE_VARIABLE, "").strip()
    return PromptCache(prompt_cache_dir(),
                       max_bytes=parse_size(size) if size else DEFAULT_MAX_BYTES)


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?", text.strip(), re.IGNORECASE)
    if not m:
        raise UsageError(f"{SIZE_VARIABLE}={text!r}: give a size such as 500M or 4G")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])
