"""`infer worker`: offer this machine's devices to other machines' infer (llama.cpp RPC)."""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Mapping
from typing import Annotated, Any

import typer

from infer.cli.errors import shielded
from infer.runtime.errors import ResourceError, UsageError

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def worker(
    ctx: typer.Context,
    host: Annotated[str, typer.Option(
        "--host", help="Address to listen on. Anything but loopback exposes an "
                       "unauthenticated protocol: use it only on a network you trust.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", help="TCP port to listen on.")] = 50052,
    threads: Annotated[int | None, typer.Option(
        "-t", "--threads", help="CPU threads for the work done here (default: physical cores).",
        show_default=False)] = None,
    device: Annotated[list[str] | None, typer.Option(
        "--device", "-d", help="Offer only this device (repeatable; 'infer doctor' lists them). "
                               "Default: every GPU, else the CPU.", show_default=False)] = None,
) -> None:
    """Serve this machine's devices to 'infer run --rpc HOST:PORT' elsewhere (llama.cpp RPC)."""
    shielded(serve, ctx.params)


def _check_port(host: str, port: int) -> None:
    """Fail with a clear message now if the address cannot be listened on (ggml would only
    print a bare line and return)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise UsageError(f"--host {host}: {e.strerror}") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            raise ResourceError(f"cannot listen on {host}:{port}: {e.strerror}") from None


def serve(flags: Mapping[str, Any]) -> None:
    from infer.runtime import ggml
    from infer.runtime.llama import physical_cores

    host, port = flags["host"], flags["port"]
    if not 0 < port < 65536:
        raise UsageError(f"--port {port}: expected 1-65535")
    if flags["threads"] is not None and flags["threads"] < 1:
        raise UsageError(f"thread count must be at least 1, got {flags['threads']}")
    if not ggml.supports_rpc():
        from infer.cli.rebuild import rebuild_hint

        raise UsageError("this llama-cpp-python build has no RPC backend; rebuild it: " + rebuild_hint())
    if flags["device"]:
        devices = [ggml.device_by_name(name) for name in flags["device"]]
    else:
        local = [d for d in ggml.devices() if d.backend != "RPC"]
        devices = [d for d in local if d.offloads] or [d for d in local if d.kind == "cpu"]
    threads = flags["threads"] or physical_cores()
    _check_port(host, port)
    if host not in LOOPBACK:
        sys.stderr.write(
            f"infer: warning: listening on {host}: ggml's RPC protocol has no authentication or "
            "encryption; anyone who can reach this port can run code on these devices and read "
            "what they hold. Use it only on a network you trust.\n")
    what = ", ".join(f"{d.name} ({d.description}, {d.free / 2**30:.1f} GiB free)" for d in devices)
    sys.stderr.write(f"infer worker: serving {what} on {host}:{port} with {threads} threads "
                     "(Ctrl-C stops)\n")
    sys.stderr.flush()
    endpoint = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    server = threading.Thread(target=ggml.serve, args=(endpoint, devices, threads),
                              name="infer-rpc-server", daemon=True)
    server.start()
    while server.is_alive():
        server.join(0.5)
    raise ResourceError(f"the RPC server on {host}:{port} stopped (see the lines above)")

