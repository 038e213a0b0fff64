"""`infer doctor`: what this installation can use, where its files are, and what to fix."""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import time
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from infer.cli.errors import shielded
from infer.cli.rebuild import rebuild_hint, rebuild_without

GiB = 1 << 30
LOW_DISK = 5 * GiB
# CPU features worth having that /proc/cpuinfo and llama.cpp name differently
_CPUINFO_FLAGS = {"AVX": "avx", "AVX2": "avx2", "F16C": "f16c", "FMA": "fma", "AVX512": "avx512f"}


def doctor(
    ctx: typer.Context,
    json_output: Annotated[bool, typer.Option("--json", help="Everything as one JSON object.")] = False,
    hub_timeout: Annotated[float, typer.Option(
        "--hub-timeout", help="Seconds to wait for the Hugging Face Hub to answer.")] = 3.0,
    recheck: Annotated[bool, typer.Option(
        "--recheck", help="Check again whether llama.cpp's weight repacking works on this CPU "
                          "(infer checks once per llama.cpp build, CPU and kernel).")] = False,
) -> None:
    """Check this installation: versions, backends, devices, folders, the Hub; say what to fix."""
    shielded(execute, ctx.params)


def folder_size(path: Path) -> int:
    """Bytes under ``path``, not following links (the Hub cache links snapshots to blobs)."""
    total = 0
    stack = [path]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    stack.append(Path(e.path))
                elif e.is_file(follow_symlinks=False):
                    total += e.stat(follow_symlinks=False).st_size
            except OSError:
                continue
    return total


def _folder(path: Path) -> dict[str, Any]:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free if probe.exists() else None
    return {"path": str(path), "exists": path.exists(),
            "size_bytes": folder_size(path) if path.exists() else 0, "disk_free_bytes": free}


def _hub(timeout: float) -> dict[str, Any]:
    from huggingface_hub import constants

    from infer.quant.hub import offline_mode

    endpoint = os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
    out: dict[str, Any] = {"endpoint": endpoint, "offline": offline_mode(), "reachable": None,
                           "detail": None}
    if out["offline"]:
        out["detail"] = "offline mode is on (HF_HUB_OFFLINE)"
        return out
    import http.client

    url = urllib.parse.urlsplit(endpoint)
    conn_class = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    t0 = time.perf_counter()
    try:
        conn = conn_class(url.hostname or "", url.port, timeout=timeout)
        conn.request("HEAD", "/api/models?limit=1")
        status = conn.getresponse().status
        conn.close()
        out["reachable"] = status < 500
        out["detail"] = f"HTTP {status} in {(time.perf_counter() - t0) * 1000:.0f} ms"
    except (OSError, http.client.HTTPException) as e:
        out["reachable"] = False
        out["detail"] = str(getattr(e, "strerror", None) or e) or type(e).__name__
    return out


def _host_cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _gpu_hardware() -> str | None:
    """A GPU this machine has that llama.cpp has a backend for, as a CMake backend name."""
    if sys.platform == "darwin" and platform.machine() == "arm64":
        return "METAL"
    if shutil.which("nvidia-smi") or Path("/proc/driver/nvidia").exists():
        return "CUDA"
    if shutil.which("rocminfo") or Path("/dev/kfd").exists():
        return "HIP"
    return None


def _repack(recheck: bool) -> dict[str, Any]:
    from infer.cli.flags import remember_checks, repack_off_by_environment
    from infer.runtime import repack

    remember_checks()
    found = repack.verdict(fresh=recheck)
    off_by_hand = repack_off_by_environment()
    return {"on": found.repack and not off_by_hand, "check": found.outcome, "detail": found.detail,
            "buffers": list(found.buffers), "off_by_hand": off_by_hand}


def gather(hub_timeout: float, recheck: bool = False) -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    from huggingface_hub import constants

    from infer.cli import __version__
    from infer.quant.paths import infer_home
    from infer.runtime import ggml
    from infer.runtime.llama import llama_cpp_version, physical_cores
    from infer.runtime.placement import host_free

    try:
        bindings = version("llama_cpp_python")
    except PackageNotFoundError:
        bindings = None
    backends = ggml.backends()
    devices = [{"name": d.name, "description": d.description, "type": d.kind, "backend": d.backend,
                "free_bytes": d.free, "total_bytes": d.total} for d in ggml.devices()]
    features = ggml.cpu_features()
    info: dict[str, Any] = {
        "infer": __version__,
        "llama_cpp_python": bindings,
        "llama_cpp": llama_cpp_version(),
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "backends": backends,
        "rpc": ggml.supports_rpc(),
        "gpu_offload": ggml.gpu_offload_available(),
        "cpu_features": sorted(k for k, v in features.items() if v),
        "repack": _repack(recheck),
        "devices": devices,
        "threads": {"physical_cores": physical_cores(), "logical_cpus": os.cpu_count(),
                    "default": physical_cores()},
        "memory": {"available_bytes": host_free(),
                   "total_bytes": next((d.total for d in ggml.devices() if d.kind == "cpu"), None)},
        "infer_home": _folder(infer_home()),
        "hf_cache": _folder(Path(constants.HF_HUB_CACHE)),
        "hub": _hub(hub_timeout),
    }
    info["problems"] = problems(info, _gpu_hardware(), _host_cpu_flags())
    return info


def problems(info: Mapping[str, Any], gpu: str | None, cpu_flags: set[str]) -> list[dict[str, str]]:
    """What is wrong or missing, each with what to do about it."""
    found: list[dict[str, str]] = []
    backends = {b.upper() for b in info["backends"]}
    if gpu and gpu not in backends:
        found.append({"problem": f"this machine has a GPU that llama.cpp can use ({gpu}) but "
                                 "llama-cpp-python was built without it: models run on the CPU only",
                      "fix": rebuild_hint(gpu=gpu)})
    if not info["rpc"]:
        found.append({"problem": "llama-cpp-python was built without the RPC backend: "
                                 "'infer worker' and --rpc are unavailable",
                      "fix": rebuild_hint(gpu=gpu if gpu in backends else None)})
    repack = info.get("repack") or {}
    if repack.get("check") == "crashed":
        found.append({"problem": f"{repack['detail']}: models load without weight repacking (as with "
                                 "--no-repack), slower for the weight types those kernels serve",
                      "fix": rebuild_without(repack["buffers"], cpu_flags, gpu if gpu in backends else None)
                      + "  (or a newer llama-cpp-python, whose llama.cpp may have fixed it; infer "
                      "checks again after any rebuild)"})
    elif repack.get("check") == "unknown":
        found.append({"problem": f"the check of llama.cpp's weight repacking failed: {repack['detail']}; "
                                 "repacking stays on",
                      "fix": "run 'infer doctor --recheck'; if a model then crashes, use --no-repack "
                             "(or INFER_NO_REPACK=1)"})
    have = set(info["cpu_features"])
    missing = [name for name, flag in _CPUINFO_FLAGS.items() if flag in cpu_flags and name not in have]
    if missing:
        found.append({"problem": f"the CPU backend was built without {', '.join(missing)}, which "
                                 "this CPU has: slower than it could be",
                      "fix": rebuild_hint(gpu=gpu if gpu in backends else None)
                      + "  (on the machine that runs it, so the build targets its CPU)"})
    hub = info["hub"]
    if not hub["offline"] and hub["reachable"] is False:
        found.append({"problem": f"the Hugging Face Hub ({hub['endpoint']}) is unreachable: "
                                 f"{hub['detail']}",
                      "fix": "check the network or proxy (HTTPS_PROXY); to use only models already "
                             "downloaded, pass --offline or set HF_HUB_OFFLINE=1"})
    for key, what in (("infer_home", "infer's home folder"), ("hf_cache", "the Hugging Face cache")):
        free = info[key]["disk_free_bytes"]
        if free is not None and free < LOW_DISK:
            found.append({"problem": f"only {free / GiB:.1f} GiB free on the disk of {what} "
                                     f"({info[key]['path']})",
                          "fix": "free some space: 'infer list' and 'infer rm' show and remove models"})
    return found


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n / GiB:.1f} GiB" if n >= GiB / 10 else f"{n / (1 << 20):.0f} MiB"


def render(info: Mapping[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(soft_wrap=True, highlight=False, width=None if sys.stdout.isatty() else 160)
    console.print(f"[bold]infer {info['infer']}[/] · llama-cpp-python {info['llama_cpp_python']} · "
                  f"llama.cpp {info['llama_cpp']} · Python {info['python']} · {info['platform']}")
    console.print(f"backends: {', '.join(info['backends'])}"
                  f"{'' if info['rpc'] else ' (no RPC)'}; GPU offload: "
                  f"{'yes' if info['gpu_offload'] else 'no'}")
    console.print(f"CPU features: {' '.join(info['cpu_features']) or 'none reported'}")
    r = info["repack"]
    state = "on" if r["on"] else "off"
    why = ("INFER_NO_REPACK is set" if r["off_by_hand"] else r["detail"])
    console.print(f"weight repacking: {state} ({why})")
    t = info["threads"]
    console.print(f"threads: {t['default']} by default ({t['physical_cores']} physical cores, "
                  f"{t['logical_cpus']} logical CPUs); memory: {_size(info['memory']['available_bytes'])} "
                  f"available of {_size(info['memory']['total_bytes'])}")
    table = Table(title="devices", title_justify="left")
    for col in ("name", "type", "backend", "description", "free", "total"):
        table.add_column(col, justify="right" if col in ("free", "total") else "left")
    for d in info["devices"]:
        table.add_row(d["name"], d["type"], d["backend"], d["description"], _size(d["free_bytes"]),
                      _size(d["total_bytes"]))
    console.print(table)
    for key, label in (("infer_home", "infer home"), ("hf_cache", "Hugging Face cache")):
        f = info[key]
        console.print(f"{label}: {f['path']} ({_size(f['size_bytes']) if f['exists'] else 'not created yet'}"
                      f"; {_size(f['disk_free_bytes'])} free on its disk)")
    hub = info["hub"]
    state = "offline mode" if hub["offline"] else ("reachable" if hub["reachable"] else "unreachable")
    console.print(f"Hub: {hub['endpoint']}: {state}" + (f" ({hub['detail']})" if hub["detail"] and
                                                          not hub["offline"] else ""))
    if not info["problems"]:
        console.print("[green]no problems found[/]")
    for p in info["problems"]:
        console.print(f"[yellow]problem:[/] {p['problem']}")
        console.print(f"  [bold]fix:[/] {p['fix']}")


def execute(flags: Mapping[str, Any]) -> None:
    from infer.runtime.errors import UsageError

    if not flags["hub_timeout"] > 0:
        raise UsageError(f"--hub-timeout must be more than 0 seconds, got {flags['hub_timeout']:g}")
    info = gather(flags["hub_timeout"], flags["recheck"])
    if flags["json_output"]:
        sys.stdout.write(json.dumps(info) + "\n")
    else:
        render(info)
