"""Opening a model: the one way run, chat, batch, bench and the server load a model.

A model reference becomes a local file in quant/ (`quant.registry.resolve_model`:
download, conversion, an alias's defaults); what it gives, a *model source*, is all this
module needs: ``path``, ``ctx_size`` and ``sampling`` (what its alias recommends, or None
and {}) and ``layout()`` (runtime.memory_plan.ModelLayout, raising LayoutError where the
header lacks what planning needs). From there: plan where the model goes (with the
context the alias recommends unless -c was given, and for batched work one KV stream per
sequence: `Slots`), then load it, with its sampling defaults (the file's GGUF
recommendations, then the alias's).

`plan_load` alone serves --explain (nothing is loaded) and a command that opens a session
in the background; `open_model` is both steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from infer.runtime.llama import Model
from infer.runtime.params import ContextParams
from infer.runtime.placement import Placed, place

# Context per sequence of batched work when -c is not given (at most the training context).
SLOT_CONTEXT = 2048


def default_parallel(n_params: int, n_ctx: int | None) -> int:
    """Sequences decoded together when --parallel is not given.

    Decoding is bound by reading the weights, so more sequences are nearly free until
    the arithmetic catches up, which happens sooner on bigger models: 16 below 4B
    parameters, 8 below 15B, 4 above. With -c, no fewer than 1,024 tokens per sequence.
    """
    by_size = 16 if n_params < 4e9 else 8 if n_params < 15e9 else 4
    return max(1, min(by_size, n_ctx // 1024)) if n_ctx else by_size


@dataclass(frozen=True)
class Slots:
    """Batched work: `parallel` sequences decoded together (None: from the model's size and
    -c), plus `extra` KV streams of their own (infer batch's shared prefix); `pooled`: their
    KV cache is one pool (the server's: runtime/preemption.py)."""

    parallel: int | None = None
    extra: int = 0
    pooled: bool = False


@dataclass(frozen=True)
class LoadPlan:
    """Where a model source will go, and with what context; nothing is loaded yet."""

    source: Any  # the model source (quant.registry.ResolvedModel)
    placed: Placed
    parallel: int = 1  # sequences decoded together

    @property
    def params(self) -> ContextParams:
        return self.placed.params

    def open_model(self) -> OpenedModel:
        model = Model.load(self.source.path, self.params, devices=self.placed.handles)
        return OpenedModel(model, self.params, self.parallel, sampling_defaults(model, self.source),
                           self.placed)

    def open_session(self) -> Any:
        """A Session (the model and one context) for one conversation."""
        from infer.runtime.session import Session

        return Session.open(self.source.path, self.params, devices=self.placed.handles)

    def open_session_in_background(self) -> Any:
        """Session.open_in_background: a function that waits for the session."""
        from infer.runtime.session import Session

        return Session.open_in_background(self.source.path, self.params, devices=self.placed.handles)


@dataclass
class OpenedModel:
    """A loaded model, the context parameters it was planned for, and its defaults."""

    model: Model
    params: ContextParams  # the context of all its sequences together
    parallel: int
    sampling_defaults: dict[str, Any]  # the file's recommendations, then its alias's
    placed: Placed | None = field(default=None, repr=False)
    projector_file: Path | None = None  # its multimodal projector (images, audio), if it has one
    pooling: str | None = None  # an embedding model's pooling, by its alias, where its GGUF records none


def plan_load(source: Any, cparams: ContextParams, *, slots: Slots | None = None,
              reserve: int = 0) -> LoadPlan:
    """Where `source` goes with `cparams` (its alias's context unless cparams.n_ctx is set);
    with `slots`, a KV stream per sequence: without -c, SLOT_CONTEXT cells each (at most the
    training context); -c is the cells of all of them (-c 0: the training context's, as
    llama-server's). With pooled slots, -c's default is the model's context (as a single
    context's: its training context, shrunk to what fits). ResourceError where it cannot
    fit; NetworkError for an --rpc worker that cannot be reached. `reserve`: bytes kept for a
    projector (its file's size)."""
    if source.ctx_size and cparams.n_ctx is None:
        cparams = replace(cparams, n_ctx=source.ctx_size)
    if slots is None:
        return LoadPlan(source, place(source.layout, cparams, reserve=reserve))
    layout = source.layout()
    if cparams.n_ctx == 0:
        cparams = replace(cparams, n_ctx=cparams.resolved_n_ctx(layout.n_ctx_train))
    parallel = slots.parallel or default_parallel(layout.n_params, cparams.n_ctx)
    streams = parallel + slots.extra
    n_ctx = cparams.n_ctx or (None if slots.pooled else
                              streams * min(layout.n_ctx_train or SLOT_CONTEXT, SLOT_CONTEXT))
    placed = place(source.layout, replace(cparams, n_ctx=n_ctx, n_seq_max=streams), whole=slots.pooled,
                   reserve=reserve)
    return LoadPlan(source, placed, parallel)


def open_model(source: Any, cparams: ContextParams, *, slots: Slots | None = None,
               reserve: int = 0) -> OpenedModel:
    """Plan and load `source` (see plan_load)."""
    return plan_load(source, cparams, slots=slots, reserve=reserve).open_model()


def sampling_defaults(model: Model, source: Any) -> dict[str, Any]:
    """The model's recommended sampling (GGUF metadata), then its alias's."""
    from infer.runtime.sampling import model_sampling_defaults

    return {**model_sampling_defaults(model.meta), **source.sampling}
