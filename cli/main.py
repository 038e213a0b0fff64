"""The `infer` command: a Typer app whose commands are thin adapters over the library."""

from __future__ import annotations

from typing import Annotated

import typer

from infer.cli import __version__, models
from infer.cli.batch import batch
from infer.cli.bench import bench
from infer.cli.chat import chat
from infer.cli.doctor import doctor
from infer.cli.errors import guarded
from infer.cli.prompt_cache import cache_app
from infer.cli.quantize import quantize
from infer.cli.run import run
from infer.cli.worker import worker

app = typer.Typer(
    name="infer",
    help="Run local language models on llama.cpp.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


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


@app.callback()
def root(
    version: Annotated[bool | None, typer.Option(
        "--version", callback=_print_version, is_eager=True,
        help="Show infer's version and the llama.cpp build it runs on.")] = None,
) -> None:
    """Run local language models on llama.cpp."""


app.command("run", no_args_is_help=True)(run)
app.command("chat", no_args_is_help=True)(chat)
app.command("pull", no_args_is_help=True)(models.pull)
app.command("list")(models.list_models)
app.command("show", no_args_is_help=True)(models.show)
app.command("rm", no_args_is_help=True)(models.rm)
app.command("quantize", no_args_is_help=True)(quantize)
app.command("bench", no_args_is_help=True)(bench)
app.command("batch", no_args_is_help=True)(batch)
app.command("doctor")(doctor)
app.command("worker")(worker)
app.add_typer(cache_app, name="cache")


def main() -> None:
    """Console entry point: run the app, map every failure to its exit code."""
    guarded(_invoke)


def _invoke() -> int:
    from infer.runtime.errors import UsageError

    try:
        result = app(standalone_mode=False, prog_name="infer")
    except typer.Abort:
        raise KeyboardInterrupt from None
    except Exception as e:
        # Click's parse errors (Typer vendors click in recent versions, so match the
        # protocol, not a class): a message and an exit code, 2 for usage errors.
        if not (hasattr(e, "format_message") and getattr(e, "exit_code", None) == 2):
            raise
        ctx = getattr(e, "ctx", None)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        raise UsageError(f"{e.format_message()}{hint}") from None
    return result if isinstance(result, int) else 0
