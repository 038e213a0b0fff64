"""The shape of the code (issue 31): small modules and functions, and no import cycles.

Read from the source with `ast`, so these hold for every import, including those made
inside a function or only for type checking: a cycle between two modules is a cycle
however late either side imports the other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cli", "runtime", "quant", "server")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _modules() -> dict[str, Path]:
    """infer's module names ("infer.runtime.llama.model") -> their files."""
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(("infer", *parts))] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The infer modules `name` imports, anywhere in its file (a package's own
    submodules imported from its __init__ count: `from infer.x import y` is x.y if that is
    a module, else x)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {m for m in found if m in MODULES and m != name}


def test_modules_are_small():
    big = {str(p.relative_to(ROOT)): n for p in MODULES.values()
           if (n := p.read_text(encoding="utf-8").count("\n")) > MAX_MODULE_LINES}
    assert not big, f"modules over {MAX_MODULE_LINES} lines: {big}"


def test_functions_are_small():
    long = []
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def _cycle() -> list[str] | None:
    graph = {name: _imports(name, path) for name, path in MODULES.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for name in sorted(graph):
        if name not in state:
            found = visit(name)
            if found:
                return found
    return None


def test_no_import_cycles():
    cycle = _cycle()
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("layer, forbidden", [
    ("infer.runtime", ("infer.cli", "infer.server", "infer.quant")),
    ("infer.quant", ("infer.cli", "infer.server")),
    ("infer.server", ("infer.cli",)),
])
def test_layers_import_downwards(layer, forbidden):
    wrong = sorted(f"{name} imports {m}" for name, path in MODULES.items() if name.startswith(layer + ".")
                   or name == layer for m in _imports(name, path) if m.startswith(forbidden))
    assert not wrong, wrong
