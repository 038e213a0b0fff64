"""The `infer` app: Typer, with commands that are thin adapters over the library."""

from __future__ import annotations

import importlib
import re
from typing import Annotated

import typer

from infer.cli import __version__

# Each command: its module and the function (or Typer sub-app) in it, in this order in
# `infer --help`. A command given too few arguments says so in one line, with where its
# help is (its help is not an error message). A run imports and
# builds only the command it names: building every command's options through Typer's
# introspection, and importing every command's module, cost each `infer run` about 40 ms
# (0.434 -> 0.396 s for `infer run MODEL Hello -n 1`, medians of 15 alternated runs).
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("infer.cli.run", "run"),
    "chat": ("infer.cli.chat", "chat"),
    "pull": ("infer.cli.models", "pull"),
    "list": ("infer.cli.models", "list_models"),
    "show": ("infer.cli.models", "show"),
    "rm": ("infer.cli.models", "rm"),
    "quantize": ("infer.cli.quantize", "quantize"),
    "bench": ("infer.cli.bench", "bench"),
    "batch": ("infer.cli.batch", "batch"),
    "embed": ("infer.cli.embed", "embed"),
    "rerank": ("infer.cli.rerank", "rerank"),
    "serve": ("infer.cli.serve", "serve"),
    "doctor": ("infer.cli.doctor", "doctor"),
    "worker": ("infer.cli.worker", "worker"),
    "cache": ("infer.cli.cache", "cache_app"),
}


def version_text() -> str:
    from importlib.metadata import PackageNotFoundError, version

    from infer.runtime.ggml import backends
    from infer.runtime.llama import llama_cpp_version

    try:
        bindings = version("llama_cpp_python")
    except PackageNotFoundError:
        bindings = "unknown"
    backend = ", ".join(backends())
    return (f"infer {__version__}\n"
            f"llama.cpp {llama_cpp_version()} (llama-cpp-python {bindings}, {backend})")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(version_text())
        raise typer.Exit()


def root(
    version: Annotated[bool | None, typer.Option(
        "--version", callback=_print_version, is_eager=True,
        help="Show infer's version and the llama.cpp build it runs on.")] = None,
) -> None:
    """Run local language models on llama.cpp."""


def build_app(only: str | None = None) -> typer.Typer:
    """The `infer` app with every command, or with just the command `only`."""
    app = typer.Typer(
        name="infer",
        help="Run local language models on llama.cpp.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    app.callback()(root)
    for name, (module, attr) in COMMANDS.items():
        if only is not None and name != only:
            continue
        target = getattr(importlib.import_module(module), attr)
        if isinstance(target, typer.Typer):
            app.add_typer(target, name=name)
        else:
            app.command(name)(target)
    return app


def _named_command(argv: list[str]) -> str | None:
    """The command the arguments name, when they start with one; else None (help,
    --version, a mistyped name: the whole app answers those)."""
    return argv[0] if argv and argv[0] in COMMANDS else None


def invoke(argv: list[str]) -> int:
    """Parse `argv` (without the program name) and run the command it names."""
    from infer.runtime.errors import UsageError

    try:
        app = build_app(_named_command(argv))
        result = app(args=argv, standalone_mode=False, prog_name="infer")
    except typer.Abort:
        raise KeyboardInterrupt from None
    except Exception as e:
        # Click's parse errors (Typer vendors click in recent versions, so match the
        # protocol, not a class): a message and an exit code, 2 for usage errors.
        if not (hasattr(e, "format_message") and getattr(e, "exit_code", None) == 2):
            raise
        if type(e).__name__ == "NoArgsIsHelpError":  # the help is on the screen: nothing to add
            raise SystemExit(2) from None
        ctx = getattr(e, "ctx", None)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        # Typer and click each add their own "Did you mean ...?" to an unknown command.
        message = re.sub(r"( Did you mean [^?]*\?)\1+", r"\1", e.format_message()).rstrip(".")
        raise UsageError(f"{message}{hint}") from None
    return result if isinstance(result, int) else 0
