"""`infer serve [MODEL]`: an OpenAI-compatible server whose requests share one continuous batch.

The command only gathers settings, checks them, binds the port and runs the server
(`infer.server`); it hands the server a function that turns a requested name into a
loaded model, the way `infer run` would find and place it, but never downloading.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from infer.cli import options as o
from infer.cli.errors import shielded
from infer.cli.flags import (
    context_params,
    log_to_stderr,
    read_text_file,
    resolve,
    sampling_overrides,
    spec_params,
)
from infer.runtime.errors import ResourceError, UsageError

SERVER = "Server"


@o.model_command(
    ("model", Annotated[str | None, typer.Argument(
        help="The model served when a request names none (loaded at start). Requests may name any "
             "model already on this machine.", show_default=False)], None),
    ("host", Annotated[str, typer.Option("--host", help="Address to listen on.", rich_help_panel=SERVER)],
     "127.0.0.1"),
    ("port", Annotated[int, typer.Option("--port", help="Port to listen on.", rich_help_panel=SERVER)], 8080),
    ("parallel", Annotated[int | None, typer.Option(
        "-np", "--parallel", help="Requests decoded together per model (default: from the model's size).",
        show_default=False, rich_help_panel=SERVER)], None),
    ("api_key", Annotated[str | None, typer.Option(
        "--api-key", help="Require 'Authorization: Bearer KEY' or 'x-api-key: KEY' (not for /health).",
        rich_help_panel=SERVER)],
     None),
    ("api_key_file", Annotated[Path | None, typer.Option(
        "--api-key-file", help="Read the API key from this file.", rich_help_panel=SERVER)], None),
    ("max_models", Annotated[int, typer.Option(
        "--max-models", help="Models held in memory at once (least recently used unloaded first).",
        rich_help_panel=SERVER)], 1),
    ("keep_alive", Annotated[str, typer.Option(
        "--keep-alive", help="Unload a model idle this long (e.g. 30s, 5m, 1h; -1: never).",
        rich_help_panel=SERVER)], "5m"),
    ("queue", Annotated[int, typer.Option(
        "--queue", help="Requests that may wait for a slot; more get 503 with Retry-After.",
        rich_help_panel=SERVER)], 256),
    ("chat_template_file", Annotated[Path | None, typer.Option(
        "--chat-template-file", help="A Jinja chat template to use instead of the models' own.",
        rich_help_panel=SERVER)], None),
    o.NO_CACHE,
    o.MMPROJ,
    o.MAX_MEDIA,
    ("allow_remote_media", Annotated[bool, typer.Option(
        "--allow-remote-media", help="Fetch images that requests give by http(s) URL (at most 20 MB, "
        "10 s each). Off: only data: URLs and base64 are read.", rich_help_panel=SERVER)], False),
    ("no_socket", Annotated[bool, typer.Option(
        "--no-socket", help="Do not listen on the Unix socket in INFER_HOME (serve.sock) as well.",
        rich_help_panel=SERVER)], False),
)
def serve(ctx: typer.Context, **flags: Any) -> None:
    """Serve models over OpenAI's API (chat and completions), many requests decoded together."""
    shielded(execute, ctx.params)


def parse_duration(text: str) -> float | None:
    """Seconds in '30s', '5m', '1h', '90' (seconds); None for a negative value (never)."""
    match = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", text)
    if match is None:
        raise UsageError(f"--keep-alive {text!r}: give a duration such as 30s, 5m or 1h (-1: never)")
    value = float(match.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[match.group(2)]
    return None if value < 0 else value


def execute(flags: Mapping[str, Any]) -> None:
    if flags["verbose"]:
        log_to_stderr()
    _check_limits(flags)
    keep_alive = parse_duration(flags["keep_alive"])
    overrides, cparams, speculation = _model_settings(flags)
    from infer.server.app import Config

    config = Config(api_key=_api_key(flags), sampling=tuple(overrides.items()),
                    chat_template=_template(flags), max_media=flags["max_media"],
                    allow_remote_media=flags["allow_remote_media"])
    if flags["model"] is not None:  # a bad default model fails now, with its exit code
        resolve({**flags, "offline": True})
    if flags["mmproj"] is not None and (flags["model"] is None or not Path(flags["mmproj"]).is_file()):
        raise UsageError(f"--mmproj {flags['mmproj']}: " + ("no such file" if flags["model"] is not None
                         else "it is the projector of the MODEL given on the command line: give one"))
    if flags["explain"]:
        raise UsageError("--explain is for infer run, chat and batch")
    from infer.cli.prompt_cache import open_cache

    cache = None if flags["no_cache"] else open_cache()  # (a bad INFER_PROMPT_CACHE_SIZE fails here)
    from infer.quant.paths import server_socket, template_cache_dir

    sock = _bind(flags["host"], flags["port"])
    local_path = server_socket()  # this user's own
    local = None if flags["no_socket"] else _bind_unix(local_path)

    from infer.runtime.template import use_compiled_cache
    from infer.server.run import serve_forever

    use_compiled_cache(template_cache_dir())

    if config.api_key is None and not _is_loopback(flags["host"]):
        sys.stderr.write(f"infer: warning: listening on {flags['host']} without an API key: anyone who can "
                         "reach this port can use the models (give --api-key or --api-key-file)\n")
    host, port = sock.getsockname()[:2]
    also = f" and unix:{local_path}" if local is not None else ""
    sys.stderr.write(f"infer: serving on http://{_url_host(host)}:{port}/v1{also} (Ctrl-C stops)\n")
    sys.stderr.flush()
    if cparams.rpc:
        from infer.cli.placement import guard_workers

        guard_workers(cparams.rpc)
    try:
        stopped = serve_forever(
            [sock] if local is None else [sock, local], context=cparams, parallel=flags["parallel"],
            default=flags["model"], config=config, max_models=flags["max_models"],
            keep_alive_s=keep_alive, max_waiting=flags["queue"], speculation=speculation,
            prompt_cache=cache, verbose=flags["verbose"],
            mmproj=Path(flags["mmproj"]) if flags["mmproj"] else None)
    finally:
        if local is not None:  # (uvicorn closes the sockets it was given but leaves their files)
            with contextlib.suppress(OSError):
                os.unlink(local_path)
    if stopped is not None:
        sys.stderr.write(f"infer: {stopped.line()}\n")


def _check_limits(flags: Mapping[str, Any]) -> None:
    if flags["parallel"] is not None and not 1 <= flags["parallel"] <= 256:
        raise UsageError("--parallel must be between 1 and 256")
    if flags["max_models"] < 1:
        raise UsageError("--max-models must be at least 1")
    if flags["queue"] < 0:
        raise UsageError("--queue must be at least 0")
    if not 0 <= flags["port"] <= 65535:
        raise UsageError(f"--port {flags['port']}: not a port number")


def _model_settings(flags: Mapping[str, Any]) -> tuple[dict[str, Any], Any, Any]:
    """The sampling overrides, context and speculation every model is served with, checked
    before anything loads."""
    from infer.runtime.sampling import SamplingParams

    overrides = sampling_overrides(flags)
    SamplingParams.resolve({}, overrides)
    cparams = context_params(flags)
    speculation = spec_params(flags)
    if speculation.type == "draft":
        raise UsageError("infer serve speculates with prompt lookup only (-md/--model-draft is for infer run "
                         "and infer chat)")
    return overrides, cparams, speculation


def _template(flags: Mapping[str, Any]) -> str | None:
    if flags["chat_template_file"] is None:
        return None
    return read_text_file(flags["chat_template_file"], "chat template file")


def _api_key(flags: Mapping[str, Any]) -> str | None:
    if flags["api_key"] is not None and flags["api_key_file"] is not None:
        raise UsageError("give --api-key or --api-key-file, not both")
    key = flags["api_key"]
    if flags["api_key_file"] is not None:
        key = read_text_file(flags["api_key_file"], "API key file").strip()
    if key is not None and (not key or any(c.isspace() for c in key)):
        raise UsageError("the API key must be non-empty and contain no spaces")
    return key


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound now so that a port in use is a one-line error."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise UsageError(f"--host {host}: {e.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise ResourceError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.set_inheritable(True)
    return sock


def _bind_unix(path: Path) -> socket.socket | None:
    """A Unix socket at `path` that only this user can open (mode 0600), so that `infer run`
    finds this server without a port (INFER_SERVER=unix); None when another live server
    holds it (it keeps it) or the path cannot be bound (TCP alone then)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.settimeout(1.0)
                try:
                    probe.connect(str(path))
                    sys.stderr.write(f"infer: note: another server listens on unix:{path}; this one on TCP "
                                     "alone\n")
                    return None
                except OSError:
                    path.unlink()  # left by a server that was killed
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        umask = os.umask(0o177)  # the socket file is created 0600
        try:
            sock.bind(str(path))
            sock.listen(2048)
        except OSError:
            sock.close()
            raise
        finally:
            os.umask(umask)
    except OSError as e:
        sys.stderr.write(f"infer: note: cannot listen on unix:{path} ({e.strerror or e}); TCP alone\n")
        return None
    sock.set_inheritable(True)
    return sock


def _is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
