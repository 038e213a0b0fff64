"""A plain `infer run` is parsed without Typer (cli/plain_args.py): the parameters it
gives the command must be exactly Typer's, and what it cannot read exactly goes to Typer."""

from __future__ import annotations

import json
import random

import pytest
import typer

from infer.cli import plain_args
from infer.cli.app import build_app

COMMAND = typer.main.get_command(build_app("run")).commands["run"]  # type: ignore[attr-defined]
SPEC = json.loads(plain_args.SPEC_FILE.read_text(encoding="utf-8"))["run"]
# A value of each kind, and one more that looks like an option or a number's edge.
VALUES = {"str": ["some text", "-x", "", "a=b", "ünï"], "int": ["7", "-1", "0", "1_000"],
          "float": ["0.5", "-2", "1e-3", "inf"]}


def typer_params(argv: list[str]) -> dict[str, object]:
    return COMMAND.make_context("run", list(argv)).params


def test_the_spec_file_is_what_typer_builds():
    assert plain_args.derive_all()["run"] == SPEC, (
        "cli/plain_args.json is out of date: run `python -m infer.cli.plain_args`")


def test_every_option_of_run_is_read_by_the_plain_parser():
    # An option it skips would send every command line using it to Typer: slower, not wrong.
    spelled = {opt for p in COMMAND.params if p.param_type_name != "argument" for opt in p.opts}
    assert spelled == set(SPEC["options"])


def _cases() -> list[list[str]]:
    cases = [["model.gguf"], ["model.gguf", "a prompt"], ["-"], ["m", "-"], ["m", ""],
             ["--raw", "m", "p"], ["m", "p", "--json", "-v"], ["-C", "next question"],
             ["m", "--stop", "a", "--stop=b", "--stop", "--c"], ["m", "-t", "1", "-t", "3"],
             ["m", "--seed", "-1", "--temp", "0"], ["m", "-ngl=5", "--top-p=0.9"],
             ["--stop", "x", "m", "--logit-bias", "15+1", "p", "--dry-sequence-breaker", "none"]]
    for opt, (_param, kind) in SPEC["options"].items():
        if kind in ("on", "off"):
            cases.append(["m", opt])
            continue
        for value in VALUES[kind]:
            cases.append(["m", opt, value])
            if len(opt) > 2:
                cases.append([f"{opt}={value}", "m"])
    rng = random.Random(18)
    options = list(SPEC["options"].items())
    for _ in range(200):  # mixtures: options in any order around the positional arguments
        units = [[a] for a in rng.sample(["m", "the prompt"], rng.randint(0, 2))]
        for opt, (_param, kind) in rng.sample(options, rng.randint(1, 8)):
            unit = [opt] if kind in ("on", "off") else [opt, rng.choice(VALUES[kind])]
            units.insert(rng.randint(0, len(units)), unit)
        cases.append([arg for unit in units for arg in unit])
    return cases


@pytest.mark.parametrize("argv", _cases(), ids=lambda a: " ".join(a)[:60])
def test_plain_command_lines_get_typers_values(argv):
    parsed = plain_args.parse("run", argv)
    assert parsed is not None, argv
    assert parsed == typer_params(argv)
    assert {k: type(v) for k, v in parsed.items()} == {k: type(v) for k, v in typer_params(argv).items()}


@pytest.mark.parametrize("argv", [
    [],                        # the command's help
    ["--help"], ["m", "-h"],   # help
    ["m", "-n"],               # a value missing
    ["m", "-n", "x"], ["m", "--temp", "warm"], ["m", "-n", "2.5"],  # values that do not convert
    ["m", "-n=5"],             # click reads "=5" as -n's value
    ["m", "-t2"], ["m", "-vC"],  # attached or bundled short options
    ["m", "--", "-p"],         # the end of options
    ["a", "b", "c"],           # an extra argument
    ["m", "--raw=1"],          # a value for a flag
    ["m", "--bogus"], ["m", "-5"],  # unknown options
])
def test_what_it_cannot_read_exactly_goes_to_typer(argv):
    assert plain_args.parse("run", argv) is None


def test_only_plain_commands_bypass_typer():
    assert plain_args.plain_command(["chat", "m"]) is None
    assert plain_args.plain_command(["run", "--help"]) is None
    execute, flags = plain_args.plain_command(["run", "m", "hi", "-n", "3"])
    from infer.cli.one_shot import execute as run_execute

    assert execute is run_execute and flags["max_tokens"] == 3 and flags["prompt"] == "hi"


def test_without_a_readable_spec_typer_parses(monkeypatch, tmp_path):
    monkeypatch.setattr(plain_args, "SPEC_FILE", tmp_path / "missing.json")
    monkeypatch.setattr(plain_args, "_specs", None)
    assert plain_args.plain_command(["run", "m", "hi"]) is None
