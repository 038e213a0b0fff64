"""Whether llama.cpp may repack a model's weights into the CPU's extra buffer types.

On the CPU, llama.cpp moves quantized weights into "extra buffer types" whose kernels
read them faster: AMX tiles on Intel Xeons (Q4_0, Q4_1, Q8_0, K-quants), interleaved
rows (CPU_REPACK: Q4_0, Q4_K, IQ4_NL... on AVX2 and NEON), KleidiAI on Arm. On some
machines those kernels kill the process: a native build of llama.cpp on an Intel Xeon
with AMX dies with SIGILL in ggml's AMX code at the first prefill (upstream:
ggml-org/llama.cpp#26954, #28756). A crash cannot be caught in the process it kills, so
the path is tried in a child process (runtime/repack_probe.py) before the first model
loads with it. The answer is kept per llama.cpp build, CPU and kernel in the file the
caller names (``remember_in``: the CLI's is INFER_HOME/repack-check.json), so the check
costs under a second once per machine and build. Where the child died, models load with
``use_extra_bufts = false`` (llama.cpp's ``-nr/--no-repack``); where it ran, nothing changes.

``Model`` asks ``allowed()``; a caller that wants repacking off (``--no-repack``) passes
``repack=False`` to ``Model`` and no check runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from infer.runtime.log import logger

log = logger("infer.repack")

CHECK_TIMEOUT_S = 120.0
_KEEP = 16  # verdicts kept in the memo (other builds, kernels, machines sharing a home)


class Verdict:
    """What the check found: WORKS, CRASHED (repacking off), NOTHING (no extra buffer
    types to check), or UNKNOWN (the check itself failed: repacking stays on)."""

    WORKS, CRASHED, NOTHING, UNKNOWN = "works", "crashed", "nothing", "unknown"

    def __init__(self, outcome: str, detail: str, buffers: tuple[str, ...] = (), *,
                 transient: bool = False) -> None:
        self.outcome = outcome
        self.detail = detail      # for a person: what happened
        self.buffers = buffers    # the extra buffer types of this build ("AMX", "CPU_REPACK")
        self.transient = transient  # not remembered: the next process checks again

    @property
    def repack(self) -> bool:
        """Whether models load with extra buffer types."""
        return self.outcome != Verdict.CRASHED

    def to_json(self) -> dict[str, object]:
        return {"outcome": self.outcome, "detail": self.detail, "buffers": list(self.buffers)}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Verdict:
        buffers = data.get("buffers")
        return cls(str(data["outcome"]), str(data.get("detail", "")),
                   tuple(str(b) for b in buffers) if isinstance(buffers, list) else ())

    def __repr__(self) -> str:
        return f"Verdict({self.outcome!r}, {self.detail!r}, {self.buffers!r})"


_memo: Callable[[], Path | None] | None = None
_settled: Verdict | None = None
_lock = threading.Lock()


def remember_in(memo: Callable[[], Path | None] | None) -> None:
    """Keep verdicts in the file ``memo()`` names (called when the first check runs);
    None: check once per process."""
    global _memo
    _memo = memo


def settle(verdict: Verdict | None) -> None:
    """Use this verdict in this process without a check (None: check again when asked)."""
    global _settled
    _settled = verdict


def allowed() -> bool:
    """Whether a model may load with extra buffer types here: the check's verdict, found
    once per process (the first call may take a second); says once in the log when not."""
    return verdict().repack


def verdict(*, fresh: bool = False) -> Verdict:
    """This process's verdict: settled, remembered, or found by a check now (``fresh``:
    check again and remember the new answer)."""
    global _settled
    with _lock:
        if _settled is not None and not fresh:
            return _settled
        found = _decide(_memo() if _memo is not None else None, fresh=fresh)
        if not found.repack:
            log.info("weight repacking is off (as llama.cpp's -nr): %s; 'infer doctor' says how to "
                     "fix it", found.detail)
        elif found.outcome == Verdict.UNKNOWN:
            log.info("weight repacking stays on, unchecked: %s", found.detail)
        _settled = found
        return found


def _decide(memo: Path | None, *, fresh: bool) -> Verdict:
    buffers = tuple(extra_buffer_types())
    if not buffers:
        return Verdict(Verdict.NOTHING, "this build has no extra buffer types")
    key = machine_key()
    if memo is not None and not fresh:
        kept = _read(memo).get(key)
        if isinstance(kept, dict) and "outcome" in kept:
            return Verdict.from_json(kept)
    found = check(buffers)
    if memo is not None and not found.transient:
        _remember(memo, key, found)
    return found


def check(buffers: tuple[str, ...]) -> Verdict:
    """Load and run a model with extra buffer types in a child process; its fate."""
    import signal
    import tempfile

    from infer.runtime.llama.bindings import physical_cores

    threads = max(2, physical_cores())  # ggml's worker threads, not only the main one
    named = ", ".join(buffers)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="infer-repack-") as folder:
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "infer.runtime.repack_probe", folder, str(threads)],
                stdin=subprocess.DEVNULL, capture_output=True, timeout=CHECK_TIMEOUT_S, cwd=folder)
        except subprocess.TimeoutExpired:
            return Verdict(Verdict.UNKNOWN, f"the check of {named} did not finish in "
                                            f"{CHECK_TIMEOUT_S:.0f} s", buffers, transient=True)
        except OSError as e:
            return Verdict(Verdict.UNKNOWN, f"the check could not start: {e}", buffers, transient=True)
    seconds = time.monotonic() - t0
    if proc.returncode < 0 or proc.returncode >= 0xC0000000:  # a signal; Windows: an NTSTATUS
        try:
            name = signal.Signals(-proc.returncode).name
        except ValueError:
            name = f"signal {-proc.returncode}" if proc.returncode < 0 else f"status {proc.returncode:#x}"
        return Verdict(Verdict.CRASHED, f"a test model with weights repacked for llama.cpp's {named} "
                                        f"kernels crashed on this CPU ({name})", buffers)
    if proc.returncode != 0:
        tail = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no message"]
        return Verdict(Verdict.UNKNOWN, f"the check of {named} failed (exit {proc.returncode}: "
                                        f"{tail[0][:300]})", buffers)
    try:
        used = [b for b in json.loads(proc.stdout.decode().strip().splitlines()[-1])["buffers"]
                if b in buffers]
    except (ValueError, KeyError, IndexError, TypeError):
        used = []
    return Verdict(Verdict.WORKS, f"a test model ran with weights repacked for {', '.join(used) or named} "
                                  f"({seconds:.1f} s check)", buffers)


def extra_buffer_types() -> list[str]:
    """The names of the CPU backend's extra buffer types in this build ("AMX", "CPU_REPACK"...)."""
    from infer.runtime.ggml import cpu_extra_buffer_types

    return cpu_extra_buffer_types()


def machine_key() -> str:
    """What the verdict depends on: the llama.cpp build (its library files), the CPU and the
    kernel. A rebuild, another CPU or a kernel update checks again."""
    parts = [platform.machine(), platform.system(), platform.release(), _cpu_identity()]
    lib = _library_folder()
    if lib is not None:
        for entry in sorted(os.scandir(lib), key=lambda e: e.name):
            if entry.is_file(follow_symlinks=False):
                st = entry.stat()
                parts.append(f"{entry.name}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def _cpu_identity() -> str:
    """The CPU's model and feature flags (Linux: /proc/cpuinfo's first processor)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            wanted = {}
            for line in f:
                if not line.strip():
                    break
                name, _, value = line.partition(":")
                if name.strip() in ("vendor_id", "model name", "flags", "Features", "CPU part"):
                    wanted[name.strip()] = value.strip()
            if wanted:
                return json.dumps(wanted, sort_keys=True)
    except OSError:
        pass
    return platform.processor()


def _library_folder() -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib"
    return lib if lib.is_dir() else None


def _read(memo: Path) -> dict[str, object]:
    try:
        data = json.loads(memo.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data.get("checks", {}) if isinstance(data, dict) else {}


def _remember(memo: Path, key: str, found: Verdict) -> None:
    from infer.runtime.atomic import write_atomic

    checks = _read(memo)
    checks.pop(key, None)
    checks[key] = {**found.to_json(), "checked": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    checks = dict(list(checks.items())[-_KEEP:])
    try:
        write_atomic(memo, (json.dumps({"checks": checks}, indent=1) + "\n").encode())
    except OSError as e:  # a read-only home: check again next time
        log.info("could not keep the repacking check in %s: %s", memo, e)
