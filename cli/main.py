"""The `infer` command's entry points: `console` (the installed script) and `main`.

A plain `infer run` is parsed without Typer (cli/plain_args.py says why); everything
else, and whatever that parser does not take, goes to the Typer app (cli/app.py).

Start-up is paid by every call of a shell loop, and through a server (cli/remote.py) it
is most of a call's own time. So the modules on that path import `typing` and
`collections.abc` only for the type checker (`TYPE_CHECKING = False`, then
`if TYPE_CHECKING:`), and use no dataclasses and no `logging` (runtime/log.py): those
cost about 20 ms a call (benchmarks/README.md, "Start-up"). tests/test_cli_app.py
checks that they stay out.
"""

from __future__ import annotations

import contextlib
import os
import sys

from infer.cli.errors import guarded, shielded

TYPE_CHECKING = False  # (why: this module's docstring)
if TYPE_CHECKING:
    from typing import NoReturn


def main() -> None:
    """Run the app, map every failure to its exit code (raised as SystemExit)."""
    guarded(_invoke)


def console() -> NoReturn:
    """The installed `infer` command: `main`, then out of the process without the
    interpreter's teardown. Freeing every module and llama.cpp's static objects cost a
    one-shot `infer run` about 20 ms (7 % of a run of 16 tokens on a 156M model,
    benchmarks/startup.py) and does nothing a finished command needs. What a normal exit
    does that matters still happens first: threads that are not daemons are joined (a
    prompt-cache state being written) and exit functions run."""
    try:
        main()
        code = 0
    except SystemExit as e:
        if isinstance(e.code, str):
            sys.stderr.write(e.code + "\n")
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    import atexit

    threading = sys.modules.get("threading")  # (never imported: no thread was started)
    for thread in threading.enumerate() if threading else ():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: what could be written was
            stream.flush()
    os._exit(code)


def _invoke() -> int:
    argv = sys.argv[1:]
    from infer.cli.plain_args import plain_command

    plain = plain_command(argv)
    if plain is not None:
        execute, flags = plain
        return shielded(execute, flags) or 0
    from infer.cli.app import invoke

    return invoke(argv)
