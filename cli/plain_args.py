"""`infer run` parsed without Typer, when its arguments are plain.

Importing Typer and click and building the command from its signature cost each
`infer run` about 30 ms before the model starts loading: a tenth of a whole 16-token
reply of a small model on a CPU (benchmarks/README.md, "Start-up"), paid by every
call of a shell loop. So each parameter of the command (its option spellings, its
type, whether it is a flag or may repeat, and the value it has when not given) is
derived from Typer's own command by `derive` and kept in plain_args.json beside this
module. tests/test_plain_args.py checks that file against Typer, and checks that
`parse` gives exactly Typer's values on a corpus of command lines.

`parse` takes only what it reads exactly as click does: options by their full
spellings, `--name=value` for spellings longer than one letter, values that convert,
at most the declared positional arguments. Anything else (help, bundled or attached
short options, `--`, an unknown option, a value that does not convert, no arguments)
gives None, and Typer parses the arguments, with its own help and messages.

Run `python -m infer.cli.plain_args` after changing a command's options: it rewrites
plain_args.json from the Typer app.
"""

from __future__ import annotations

import json
from pathlib import Path

TYPE_CHECKING = False  # (typing and collections.abc cost the start-up of every call: cli/main.py)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

SPEC_FILE = Path(__file__).with_name("plain_args.json")

# The commands this parser may take, and the function that runs each on its flags.
COMMANDS: dict[str, tuple[str, str]] = {"run": ("infer.cli.one_shot", "execute")}

# How a value given on the command line becomes the parameter's value.
_CONVERT: dict[str, Callable[[str], Any]] = {"str": str, "int": int, "float": float}

_specs: dict[str, Any] | None = None


def _spec(command: str) -> dict[str, Any]:
    global _specs
    if _specs is None:
        _specs = json.loads(SPEC_FILE.read_text(encoding="utf-8"))
    return _specs[command]


def defaults(command: str) -> dict[str, Any]:
    """Each parameter of `command` and its value when it is not given (as Typer gives it)."""
    spec = _spec(command)
    return {name: tuple(value) if name in spec["multiple"] else value
            for name, value in spec["defaults"].items()}


def parse(command: str, argv: list[str]) -> dict[str, Any] | None:
    """`command`'s parameters from `argv` (the arguments after the command's name), as
    Typer would give them; None where Typer must parse them itself."""
    if not argv:
        return None  # the command's help
    spec = _spec(command)
    options: dict[str, list[str]] = spec["options"]
    flags = defaults(command)
    given: dict[str, list[Any]] = {}  # the values of repeatable options, in order
    positional: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg == "-" or not arg.startswith("-"):
            positional.append(arg)
            continue
        name, explicit = arg, None
        if "=" in arg:
            name, explicit = arg.split("=", 1)
            if len(name) <= 2:  # `-n=5`: click reads "=5" as the value of -n
                return None
        if name not in options:
            return None  # --help, --, an unknown option or a bundle of short ones: Typer says
        param, kind = options[name]
        if kind in ("on", "off"):
            if explicit is not None:
                return None  # a flag takes no value
            flags[param] = kind == "on"
            continue
        text = explicit if explicit is not None else next(args, None)
        if text is None:
            return None  # the option's value is missing
        try:
            value = _CONVERT[kind](text)
        except (KeyError, ValueError):
            return None
        if param in spec["multiple"]:
            given.setdefault(param, []).append(value)
        else:
            flags[param] = value
    if len(positional) > len(spec["arguments"]):
        return None  # an extra argument
    flags.update(zip(spec["arguments"], positional, strict=False))  # fewer: the rest are unset
    flags.update((param, tuple(values)) for param, values in given.items())
    return flags


def plain_command(argv: list[str]) -> tuple[Callable[[Mapping[str, Any]], Any], dict[str, Any]] | None:
    """The function running the command `argv` names and its flags, where `argv` (the
    arguments after the program's name) is plain; else None."""
    if not argv or argv[0] not in COMMANDS:
        return None
    try:
        flags = parse(argv[0], argv[1:])
    except (OSError, ValueError, KeyError):  # no readable spec: Typer parses, as it always can
        return None
    if flags is None:
        return None
    import importlib

    module, function = COMMANDS[argv[0]]
    return getattr(importlib.import_module(module), function), flags


def derive(command: Any) -> dict[str, Any]:
    """The spec of a click command (as Typer builds it): its arguments, each option's
    spellings with the parameter and the kind of value they set, the repeatable ones,
    and every parameter's value when it is not given."""
    import click

    kinds = {click.types.StringParamType: "str", click.types.IntParamType: "int",
             click.types.FloatParamType: "float"}
    arguments: list[str] = []
    options: dict[str, list[str]] = {}
    multiple: list[str] = []

    def set_by(opt: str, name: str) -> str:  # what a flag sets: "on" (True) or "off" (False)
        value = command.make_context(command.name, [opt]).params[name]
        if not isinstance(value, bool):
            raise ValueError(f"{opt} sets {value!r}, not a boolean")
        return "on" if value else "off"

    for p in command.params:
        kind = kinds.get(type(p.type))
        if isinstance(p.type, click.Path) and getattr(p.type, "path_type", None) is None:
            kind = "str"  # click gives the path as text
        flag = bool(getattr(p, "is_flag", False))
        plain = ((kind is not None or flag) and p.nargs == 1 and not p.envvar and p.callback is None
                 and not getattr(p, "count", False))
        if isinstance(p, click.Argument):
            if not plain or p.multiple:
                raise ValueError(f"argument {p.name}: a kind that plain_args does not read")
            arguments.append(p.name)
            continue
        if not plain:
            continue  # a kind of option `parse` does not read: Typer parses any use of it
        if p.multiple:
            multiple.append(p.name)
        for opt in p.opts:
            options[opt] = [p.name, set_by(opt, p.name) if flag else kind]
        for opt in p.secondary_opts:
            options[opt] = [p.name, set_by(opt, p.name)]
    unset = command.make_context(command.name, [], resilient_parsing=True).params
    return {"arguments": arguments, "options": options, "multiple": multiple,
            "defaults": {name: list(v) if isinstance(v, tuple) else v for name, v in unset.items()}}


def derive_all() -> dict[str, Any]:
    """The spec of every command in COMMANDS, from the Typer app."""
    import typer

    from infer.cli.app import build_app

    out = {}
    for name in COMMANDS:
        group = typer.main.get_command(build_app(name))
        out[name] = derive(group.commands[name])  # type: ignore[attr-defined]
    return out


def spec_text(specs: Mapping[str, Any]) -> str:
    return json.dumps(specs, indent=1, sort_keys=True) + "\n"


if __name__ == "__main__":
    from infer.runtime.atomic import write_atomic

    write_atomic(SPEC_FILE, spec_text(derive_all()).encode())
    print(f"wrote {SPEC_FILE}")
