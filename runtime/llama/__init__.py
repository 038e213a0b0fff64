"""Where infer calls llama.cpp's C API (through llama-cpp-python's ctypes bindings).

It owns native handles (model, context, batch, sampler chain), frees them
deterministically, routes llama.cpp's log into Python ``logging`` and turns
failures into infer's typed errors. ``runtime/ggml.py`` binds ggml's device API,
which llama.cpp's does not cover; no other module calls native code.

The package's modules, each named for what it holds:

- ``bindings``: the ctypes bindings (``C``), llama.cpp's log, backend initialisation,
  versions, the machine's physical cores;
- ``model``: ``Model``, a loaded model and its vocabulary;
- ``context``: ``Context`` and ``Batch``, and the flash-attention choice;
- ``stderr``: what native code writes to file descriptor 2, captured;
- ``sampler_chain``: ``SamplerSpec`` and the native ``SamplerChain``;
- ``projector``: ``Projector``, an mmproj file through libmtmd (images and audio in), and
  the ``Chunk`` pieces of a prompt with media.

The names other modules use are importable from here (``from infer.runtime.llama import
Model``). They are looked up on first use rather than imported with the package: importing
``infer.runtime.llama.bindings`` (as ``runtime/ggml.py`` does, which ``model`` imports) then
runs no other module of the package, so no import cycle runs through this file.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> the module of this package that defines it
_EXPORTS = {
    "C": "bindings",
    "init_backend": "bindings",
    "llama_cpp_version": "bindings",
    "load_bindings_module": "bindings",
    "physical_cores": "bindings",
    "system_info": "bindings",
    "Model": "model",
    "vocab_type": "model",
    "Batch": "context",
    "Context": "context",
    "flash_attention": "context",
    "set_decode_watchdog": "context",
    "Chunk": "projector",
    "Projector": "projector",
    "projector_inputs": "projector",
    "SamplerChain": "sampler_chain",
    "SamplerSpec": "sampler_chain",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # (later look-ups find it without this function)
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
