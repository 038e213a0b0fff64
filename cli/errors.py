"""Exit codes, and the one place where errors become a one-line message on stderr."""

from __future__ import annotations

import os
import sys

from infer.runtime.errors import (
    InferError,
    LlamaError,
    ModelError,
    NetworkError,
    ResourceError,
    UsageError,
)

TYPE_CHECKING = False  # (typing and collections.abc cost the start-up of every call: cli/main.py)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, NoReturn

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_MODEL = 3
EXIT_NETWORK = 4
EXIT_RESOURCE = 5
EXIT_INTERRUPTED = 130

# Most specific first: the first class an error is an instance of decides.
EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (UsageError, EXIT_USAGE),
    (ModelError, EXIT_MODEL),
    (NetworkError, EXIT_NETWORK),
    (ResourceError, EXIT_RESOURCE),
    (LlamaError, EXIT_INTERNAL),
    (InferError, EXIT_INTERNAL),
    (MemoryError, EXIT_RESOURCE),
)


class Interrupted(Exception):
    """Ctrl-C inside a command, carried past Typer (which would turn it into a bare exit code)."""


class OutputClosed(Exception):
    """The reader of stdout went away (`infer run ... | head`), carried past Typer."""


def shielded(func: Callable[..., Any], *args: object) -> Any:
    """Run a command's body (its result: an exit code, if any); Ctrl-C and a closed stdout
    leave it as infer's own exceptions."""
    try:
        return func(*args)
    except KeyboardInterrupt:
        raise Interrupted from None
    except BrokenPipeError:
        raise OutputClosed from None


def exit_code_for(error: BaseException) -> int:
    for cls, code in EXIT_CODES:
        if isinstance(error, cls):
            return code
    if isinstance(error, OSError) and error.errno == 28:  # ENOSPC
        return EXIT_RESOURCE
    return EXIT_INTERNAL


def debug_enabled() -> bool:
    return os.environ.get("INFER_DEBUG", "") not in ("", "0")


def print_error(message: str, *, prefix: str = "infer: error:") -> None:
    """One line on stderr: `infer: error: ...` (red when stderr is a colour terminal)."""
    if sys.stderr.isatty() and "NO_COLOR" not in os.environ:
        prefix = f"\033[1;31m{prefix}\033[0m"
    first_line = " ".join(message.split("\n")[0].split()) or "unknown error"
    try:
        sys.stderr.write(f"{prefix} {first_line}\n")
        sys.stderr.flush()
    except (BrokenPipeError, OSError):
        pass


def silence_stdout() -> None:
    """After a broken pipe, point stdout at /dev/null so the interpreter's final flush is quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def guarded(func: Callable[[], int | None]) -> NoReturn:
    """Run `func`, turn every failure into a message and an exit code, and exit."""
    try:
        code = func() or EXIT_OK
    except (KeyboardInterrupt, Interrupted):
        print_error("interrupted", prefix="infer:")
        code = EXIT_INTERRUPTED
    except (BrokenPipeError, OutputClosed):
        silence_stdout()
        code = EXIT_OK
    except SystemExit:
        raise
    except BaseException as e:
        code = exit_code_for(e)
        if code == EXIT_INTERNAL and not isinstance(e, InferError):
            if debug_enabled():
                import traceback

                traceback.print_exc()
            print_error(f"internal error: {type(e).__name__}: {e} "
                        "(a bug in infer; INFER_DEBUG=1 shows the traceback)")
        else:
            if debug_enabled():
                import traceback

                traceback.print_exc()
            print_error(str(e))
    sys.exit(code)
