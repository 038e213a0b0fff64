"""Weight repacking on every side of a benchmark, as infer has it on this machine.

infer loads models without llama.cpp's extra buffer types (its weight repacking: AMX,
CPU_REPACK) where its one-time check found that they crash this CPU (runtime/repack.py), or
where INFER_NO_REPACK=1 asks. llama.cpp's tools and the bindings would repack anyway (and
crash, or run other kernels than infer), so a benchmark asks `state()` once, prints its
`line()`, loads in-process sides with `use_extra_bufts = state().on`, and gives each
llama.cpp tool `peer_args(tool)`.
"""

from __future__ import annotations

from functools import cache


class State:
    def __init__(self, on: bool, why: str) -> None:
        self.on, self.why = on, why


@cache
def state() -> State:
    from infer.cli.flags import NO_REPACK_VARIABLE, remember_checks, repack_off_by_environment
    from infer.runtime import repack

    if repack_off_by_environment():
        return State(False, f"{NO_REPACK_VARIABLE} is set")
    remember_checks()  # the verdict infer keeps in INFER_HOME, as `infer run` reads it
    found = repack.verdict()
    return State(found.repack, found.detail)


def line() -> str:
    s = state()
    return (f"weight repacking on every side: {'on' if s.on else 'off'} ({s.why}"
            f"{'' if s.on else '; llama.cpp tools get -nr'})")


def peer_args(tool: str) -> list[str]:
    """The flags that give llama.cpp's `tool` infer's repacking setting."""
    if state().on:
        return []
    return ["--repack", "0"] if tool == "llama-bench" else ["-nr"]


def patch_llama_cpp_python() -> None:
    """Make llama-cpp-python's `Llama`, which takes no repacking setting, load as infer does."""
    import llama_cpp.llama_cpp as bindings

    defaults = bindings.llama_model_default_params
    on = state().on

    def as_infer_loads() -> object:  # (a llama_model_params structure)
        params = defaults()
        params.use_extra_bufts = on
        return params

    bindings.llama_model_default_params = as_infer_loads
