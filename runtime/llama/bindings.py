"""llama-cpp-python's ctypes bindings (``C``), llama.cpp's log routed into Python ``logging``,
backend initialisation and what the build and the machine say about themselves.

Every other module of the package calls llama.cpp through ``C`` from here;
``runtime/ggml.py`` imports it too. This module imports neither of them.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import logging
import os
import re
import sys
import threading
import types
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

from infer.runtime.errors import LlamaError
from infer.runtime.log import logger

log = logger("infer.llama")


_LOADING = threading.Lock()


def load_bindings_module(name: str) -> types.ModuleType:
    """Import ``llama_cpp.<name>`` without running the package's ``__init__``.

    ``import llama_cpp`` also imports the high-level ``Llama`` class and its chat
    formats, which costs a noticeable share of a one-shot ``infer run``'s start-up.
    A bare package object stands in while the submodule loads, then is removed so
    that a later ``import llama_cpp`` elsewhere still gets the real package.

    One thread at a time: a module is in ``sys.modules`` before it has run, and the server's
    request threads asking for the grammar converter together got one without its classes.
    """
    with _LOADING:
        return _load(f"llama_cpp.{name}")


def _load(full: str) -> types.ModuleType:
    if full in sys.modules:
        return sys.modules[full]
    if "llama_cpp" in sys.modules:
        return importlib.import_module(full)
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.submodule_search_locations is None:
        raise LlamaError("llama-cpp-python is not installed (pip install llama-cpp-python)")
    stub = types.ModuleType("llama_cpp")
    stub.__path__ = list(spec.submodule_search_locations)
    stub.__spec__ = spec
    sys.modules["llama_cpp"] = stub
    try:
        return importlib.import_module(full)
    finally:
        if sys.modules.get("llama_cpp") is stub:
            del sys.modules["llama_cpp"]


C: Any = load_bindings_module("llama_cpp")

# ggml log levels (ggml.h) -> Python logging levels.
_LOG_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_last_level = logging.INFO
_errors: list[str] = []  # llama.cpp's error lines since the last take_errors()
# While a model loads: layer index -> the device llama.cpp put it on (its debug log
# is the only place that says; layer n_layer is the output layer).
_placement: dict[int, str] | None = None
_PLACED = re.compile(r"layer\s+(\d+) assigned to device (\S+?),")


_partial = ""  # a line llama.cpp has not finished (it logs a load's progress dot by dot)


@C.llama_log_callback
def _log_callback(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    global _last_level, _partial
    # GGML_LOG_LEVEL_CONT (5) continues the previous line at its level.
    if level != 5:
        if _partial:
            _log_line(_last_level, _partial)
            _partial = ""
        _last_level = _LOG_LEVELS.get(level, logging.INFO)
    lines = (_partial + text.decode("utf-8", "replace")).split("\n")
    _partial = lines.pop()  # "" when the text ended its line
    if _partial and _last_level >= logging.ERROR:  # an error is never held back
        lines.append(_partial)
        _partial = ""
    for line in lines:
        _log_line(_last_level, line)


def _log_line(py_level: int, line: str) -> None:
    if _placement is not None and "assigned to device" in line:
        m = _PLACED.search(line)
        if m:
            _placement[int(m.group(1))] = m.group(2)
    if py_level >= logging.ERROR:
        del _errors[:-8]
        _errors.append(line)
    if log.isEnabledFor(py_level):
        log.log(py_level, "%s", line)


@contextmanager
def layer_placement() -> Iterator[dict[int, str]]:
    """While a model loads: the layer -> device map that llama.cpp's debug log fills in."""
    global _placement
    _placement = {}
    try:
        yield _placement
    finally:
        _placement = None


def take_errors() -> str:
    """The error lines llama.cpp logged since the last call, joined, for an error message."""
    text = " ".join(" ".join(e.split()) for e in _errors)
    _errors.clear()
    return text


def init_backend() -> None:
    """Route llama.cpp's log to ``logging`` and initialise its backends (once per process).

    The log is claimed again on every call: another library in the same process (the
    ``llama_cpp`` package's high-level ``Llama`` sets its own callback on import) would
    otherwise take the lines a model load's placement and error messages are read from."""
    C.llama_log_set(_log_callback, ctypes.c_void_p(0))
    _init_backends()


def route_log(*setters: Any) -> None:
    """Send the log of another library of llama.cpp's (libmtmd: `mtmd_log_set`...) where
    llama.cpp's goes."""
    for setter in setters:
        setter(_log_callback, ctypes.c_void_p(0))


@cache
def _init_backends() -> None:
    C.llama_backend_init()


def llama_cpp_version() -> str:
    """The llama.cpp build the bindings were compiled from."""
    raw = C.llama_version()
    return raw.decode() if raw else "unknown"


def system_info() -> str:
    return C.llama_print_system_info().decode("utf-8", "replace").strip()


def physical_cores() -> int:
    """Physical cores this process may use: llama.cpp's default thread count."""
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = os.cpu_count() or 1
    cores: set[tuple[str, str]] = set()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            phys = core = ""
            for line in f:
                if line.startswith("physical id"):
                    phys = line.split(":", 1)[1].strip()
                elif line.startswith("core id"):
                    core = line.split(":", 1)[1].strip()
                    cores.add((phys, core))
    except OSError:
        pass
    return max(1, min(allowed, len(cores) or allowed))
