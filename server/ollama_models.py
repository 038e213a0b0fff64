"""Ollama's model listings over the server's models: /api/version, /api/tags (what can be
served), /api/ps (what is loaded) and /api/show (one model's details, template and
capabilities; it loads the model, as a request would). Names are infer's: the aliases and
`owner/repo[:QUANT]` references `infer run` takes, which are the names Ollama users type
(`smollm2`, `qwen3:4b`, ...)."""

from __future__ import annotations

import hashlib
import time
from datetime import datetime, timezone
from typing import Any

from infer.server.models import ModelPool, Served

# The Ollama API level infer speaks, for the clients that check /api/version before they talk.
OLLAMA_API_VERSION = "0.12.0"


def version() -> dict[str, Any]:
    return {"version": OLLAMA_API_VERSION}


def _stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat().replace("+00:00", "Z")


def _details(served: Served | None) -> dict[str, Any]:
    if served is None:
        return {"format": "gguf", "family": "", "families": None, "parameter_size": "",
                "quantization_level": ""}
    model = served.model
    arch = model.meta("general.architecture") or ""
    desc = model.description().split()
    return {"format": "gguf", "family": arch, "families": [arch] if arch else None,
            "parameter_size": f"{model.n_params / 1e9:.2f}B" if model.n_params >= 1e9 else
            f"{model.n_params / 1e6:.0f}M", "quantization_level": desc[-1] if desc else ""}


def _entry(name: str, served: Served | None) -> dict[str, Any]:
    size, modified = 0, 0.0
    if served is not None:
        stat = served.model.path.stat()
        size, modified = stat.st_size, stat.st_mtime
    digest = hashlib.sha256(name.encode()).hexdigest()  # (a stable id per name, as clients key on it)
    return {"name": name, "model": name, "modified_at": _stamp(modified), "size": size, "digest": digest,
            "details": _details(served)}


def tags(pool: ModelPool, names: list[str]) -> dict[str, Any]:
    """What can be served; sizes and details where a model is loaded (the others are read when
    they load)."""
    return {"models": [_entry(name, pool.loaded.get(name)) for name in names]}


def ps(pool: ModelPool) -> dict[str, Any]:
    out = []
    for name, served in pool.loaded.items():
        entry = _entry(name, served)
        expires = 0.0
        if pool.keep_alive_s is not None:
            idle_s = time.monotonic() - served.engine.last_used if served.engine.idle else 0.0
            expires = time.time() + pool.keep_alive_s - idle_s
        out.append({**entry, "expires_at": _stamp(expires) if expires else None, "size_vram": 0,
                    "context_length": served.engine.context.n_ctx})
    return {"models": out}


def show(served: Served, template: str | None) -> dict[str, Any]:
    """One model's details (off the event loop: the template is analysed). Its capabilities:
    completion, tools (every template: infer's generic form serves those that know none) and
    thinking where the template has a reasoning convention (runtime/prompt.reasoning_format)."""
    from infer.runtime.prompt import reasoning_format

    model = served.model
    capabilities = ["completion", "tools"]
    if reasoning_format(model, template) is not None:
        capabilities.append("thinking")
    info = {"general.architecture": model.meta("general.architecture"),
            "general.parameter_count": model.n_params,
            "context_length": served.engine.context.n_ctx}
    template = template or model.chat_template() or ""
    return {"modelfile": f"FROM {model.path}\n", "parameters": "", "template": template,
            "details": _details(served), "model_info": info, "capabilities": capabilities,
            "modified_at": _stamp(model.path.stat().st_mtime)}
