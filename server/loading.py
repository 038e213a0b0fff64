"""How the server turns a requested name into a loaded model: the name resolved offline
(a server never downloads), then opened as every command opens a model
(runtime/loading.py), with one KV stream per slot."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from infer.quant.registry import resolve_model
from infer.runtime.loading import OpenedModel, Slots, open_model
from infer.runtime.params import ContextParams


def model_names() -> list[str]:
    """The models on this machine, by the names a request can use."""
    from infer.quant.store import cached_models, embedded_models

    names = []
    for m in embedded_models() + cached_models():
        names.append(m.alias or (f"{m.repo}:{m.quant}" if m.quant else m.repo))
    return names


def find_model(name: str) -> None:
    """Raise ModelNotFoundError for a name this server cannot serve (before anything is
    unloaded to make room for it)."""
    resolve_model(name, offline=True)


def open_for_serving(name: str, cparams: ContextParams, parallel: int | None,
                     mmproj: Path | None = None) -> OpenedModel:
    """Load `name` with `parallel` slots (None: from the model's size) in the context `cparams`;
    its projector is `mmproj` if given, else the one that came with it from its repository."""
    resolved = resolve_model(name, offline=True)
    projector = mmproj or resolved.mmproj
    reserve = projector.stat().st_size if projector is not None and projector.is_file() else 0
    opened = open_model(resolved, cparams, slots=Slots(parallel, pooled=True), reserve=reserve)
    resolved.record_use()  # (and again when it is unloaded: server/models.py)
    return replace(opened, projector_file=projector, pooling=resolved.pooling)
