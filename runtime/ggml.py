"""ggml's backend registry: which backends this build has and the devices they offer.

The second module (with ``runtime/llama/``) that calls native code: llama.cpp's
own API has no calls for devices, so this one binds the few ``ggml_backend_*``
functions it needs from the ggml library that llama-cpp-python installs next to
libllama. Devices of the RPC backend (other machines' workers) are added here too.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from infer.runtime.errors import LlamaError, NetworkError, UsageError
from infer.runtime.llama.bindings import C, init_backend, system_info

# enum ggml_backend_dev_type (ggml-backend.h)
DEVICE_KINDS = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}


@dataclass(frozen=True)
class Device:
    """One device a backend offers: the local CPU, a GPU, or a remote worker's device."""

    name: str          # ggml's name: "CPU", "CUDA0", "Metal", "RPC0"
    description: str   # the hardware, or HOST:PORT for a remote device
    kind: str          # "cpu", "gpu", "igpu", "accel" (DEVICE_KINDS)
    backend: str       # the backend that offers it: "CPU", "CUDA", "Metal", "RPC"
    free: int          # bytes of memory free now
    total: int
    handle: int = 0    # ggml_backend_dev_t, for llama_model_params.devices

    @property
    def remote(self) -> bool:
        return self.backend == "RPC"

    @property
    def offloads(self) -> bool:
        """Whether llama.cpp can put model layers on it (GPUs and remote devices)."""
        return self.kind in ("gpu", "igpu")


def _bind(lib: ctypes.CDLL, name: str, restype: Any, *argtypes: Any) -> None:
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)


@cache
def _lib() -> ctypes.CDLL:
    init_backend()
    base = Path(getattr(C, "_base_path", Path(C.__file__).parent / "lib"))
    candidates = [base / n for n in ("libggml.so", "libggml.dylib", "ggml.dll")]
    path = next((p for p in candidates if p.exists()), None)
    if path is None:
        raise LlamaError(f"the ggml library was not found next to libllama in {base}")
    lib = ctypes.CDLL(str(path))
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    _bind(lib, "ggml_backend_reg_count", sz)
    _bind(lib, "ggml_backend_reg_get", vp, sz)
    _bind(lib, "ggml_backend_reg_name", ctypes.c_char_p, vp)
    _bind(lib, "ggml_backend_reg_by_name", vp, ctypes.c_char_p)
    _bind(lib, "ggml_backend_reg_dev_count", sz, vp)
    _bind(lib, "ggml_backend_reg_dev_get", vp, vp, sz)
    _bind(lib, "ggml_backend_reg_get_proc_address", vp, vp, ctypes.c_char_p)
    _bind(lib, "ggml_backend_dev_count", sz)
    _bind(lib, "ggml_backend_dev_get", vp, sz)
    _bind(lib, "ggml_backend_dev_by_name", vp, ctypes.c_char_p)
    _bind(lib, "ggml_backend_dev_name", ctypes.c_char_p, vp)
    _bind(lib, "ggml_backend_dev_description", ctypes.c_char_p, vp)
    _bind(lib, "ggml_backend_dev_type", ctypes.c_int, vp)
    _bind(lib, "ggml_backend_dev_memory", None, vp, ctypes.POINTER(sz), ctypes.POINTER(sz))
    _bind(lib, "ggml_backend_dev_backend_reg", vp, vp)
    return lib


def backends() -> list[str]:
    """The backends compiled into (or loaded by) this build: "CPU", "CUDA", "RPC", ..."""
    lib = _lib()
    return [lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)).decode()
            for i in range(lib.ggml_backend_reg_count())]


def _device(handle: int) -> Device:
    lib = _lib()
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    lib.ggml_backend_dev_memory(handle, ctypes.byref(free), ctypes.byref(total))
    reg = lib.ggml_backend_dev_backend_reg(handle)
    return Device(
        name=lib.ggml_backend_dev_name(handle).decode("utf-8", "replace"),
        description=(lib.ggml_backend_dev_description(handle) or b"").decode("utf-8", "replace"),
        kind=DEVICE_KINDS.get(lib.ggml_backend_dev_type(handle), "unknown"),
        backend=lib.ggml_backend_reg_name(reg).decode() if reg else "unknown",
        free=int(free.value), total=int(total.value), handle=int(handle),
    )


def devices() -> list[Device]:
    """Every local device, with its memory as the backend reports it now."""
    lib = _lib()
    return [_device(lib.ggml_backend_dev_get(i)) for i in range(lib.ggml_backend_dev_count())]


def device_names_of_local_gpus(handles: Sequence[int]) -> set[str]:
    """The names of the devices among ``handles`` that are GPUs of this machine (not remote)."""
    named = [_device(h) for h in handles]
    return {d.name for d in named if d.offloads and not d.remote}


def device_by_name(name: str) -> Device:
    handle = _lib().ggml_backend_dev_by_name(name.encode())
    if not handle:
        known = ", ".join(d.name for d in devices())
        raise UsageError(f"no device named {name!r} (this build has: {known})")
    return _device(handle)


def cpu_features() -> dict[str, bool]:
    """The CPU features the CPU backend was built for, from llama.cpp's system info."""
    info = system_info()
    cpu = info.split("CPU :", 1)[1] if "CPU :" in info else ""
    cpu = re.split(r"\|\s*[A-Za-z]+ :", cpu)[0]
    return {k: v == "1" for k, v in re.findall(r"([A-Z0-9_]+) = (\d)", cpu)}


def cpu_extra_buffer_types() -> list[str]:
    """The CPU backend's extra buffer types, where llama.cpp repacks weights for faster
    kernels ("AMX", "KleidiAI", "CPU_REPACK"), in the order it prefers them."""
    lib = _lib()
    reg = lib.ggml_backend_reg_by_name(b"CPU")
    proc = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts") if reg else None
    if not proc or not lib.ggml_backend_reg_dev_count(reg):
        return []
    get = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(proc)
    bufts = get(lib.ggml_backend_reg_dev_get(reg, 0))
    _bind(lib, "ggml_backend_buft_name", ctypes.c_char_p, ctypes.c_void_p)
    names = []
    i = 0
    while bufts and bufts[i]:
        names.append(lib.ggml_backend_buft_name(bufts[i]).decode("utf-8", "replace"))
        i += 1
    return names


def gpu_offload_available(extra: list[Device] | None = None) -> bool:
    """Whether any device can take model layers. llama.cpp's own
    ``llama_supports_gpu_offload`` also says yes for a build that merely has RPC."""
    return any(d.offloads for d in [*devices(), *(extra or [])])


# -- RPC: other machines' devices -------------------------------------------------

def supports_rpc() -> bool:
    return bool(_lib().ggml_backend_reg_by_name(b"RPC"))


def _rpc_proc(name: str) -> int:
    lib = _lib()
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise UsageError(
            "this llama-cpp-python build has no RPC backend; rebuild it with "
            "CMAKE_ARGS=\"-DGGML_RPC=ON\" (see 'infer doctor')"
        )
    proc = lib.ggml_backend_reg_get_proc_address(reg, name.encode())
    if not proc:
        raise LlamaError(f"the RPC backend does not export {name}")
    return int(proc)


def parse_endpoint(text: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"bad worker address {text!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def check_reachable(endpoint: str, timeout: float = 5.0) -> None:
    """Raise NetworkError unless a TCP connection to ``endpoint`` opens within ``timeout``.

    ggml's RPC client aborts the whole process when it cannot connect, so every
    worker is tried here first.
    """
    import socket  # only with --rpc: not imported on every run

    host, port = parse_endpoint(endpoint)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as e:
        reason = "timed out" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        raise NetworkError(f"RPC worker {endpoint} is unreachable: {reason} "
                           "(is 'infer worker' running there?)") from None


def add_workers(endpoints: list[str], timeout: float = 5.0) -> list[Device]:
    """The devices that the workers at ``endpoints`` offer, connecting to each.

    They are not registered globally: pass them to ``Model(devices=...)``.
    """
    for endpoint in endpoints:
        check_reachable(endpoint, timeout)
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(_rpc_proc("ggml_backend_rpc_add_server"))
    lib = _lib()
    found: list[Device] = []
    for endpoint in endpoints:
        host, port = parse_endpoint(endpoint)
        reg = add_server(f"{host}:{port}".encode())
        if not reg:
            raise NetworkError(f"RPC worker {endpoint} offers no devices")
        found += [_device(lib.ggml_backend_reg_dev_get(reg, i))
                  for i in range(lib.ggml_backend_reg_dev_count(reg))]
    return found


def serve(endpoint: str, devices: list[Device], threads: int) -> None:
    """Offer ``devices`` to other machines' llama.cpp over ggml's RPC protocol.

    Blocks for as long as the server runs (ggml serves one client at a time and
    never returns unless it could not start); run it in a thread.
    """
    start = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                             ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p))(
        _rpc_proc("ggml_backend_rpc_start_server"))
    handles = (ctypes.c_void_p * len(devices))(*[d.handle for d in devices])
    start(endpoint.encode(), None, threads, len(devices), handles)


_ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
_abort_handlers: list[Any] = []  # keeps the ctypes callback alive


def on_native_abort(handler: Any) -> None:
    """Call ``handler(message)`` when ggml is about to abort the process.

    ggml aborts on failures it cannot return from, such as an RPC worker that
    died mid-computation; the handler gets the last word (it may exit the
    process itself with a clear message instead of a core dump).
    """
    lib = _lib()
    lib.ggml_set_abort_callback.restype = ctypes.c_void_p
    lib.ggml_set_abort_callback.argtypes = [_ABORT_CALLBACK]

    def call(message: bytes | None) -> None:
        handler((message or b"").decode("utf-8", "replace"))

    cb = _ABORT_CALLBACK(call)
    _abort_handlers[:] = [cb]
    lib.ggml_set_abort_callback(cb)
