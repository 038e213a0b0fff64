"""`infer run` through the real CLI: determinism, stopping, JSON, stdin rules, exit codes.

The tests marked with the `infer_run` fixture run twice: with the model loaded in the
process, and through a running `infer serve` (INFER_SERVER), with the same assertions.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import httpx
import pytest
from conftest import CLI, assert_ctrl_c_keeps_the_text, assert_one_line_error, run_cli
from serve_helpers import Server


@pytest.fixture(scope="module")
def tiny_qwen_server(tiny_qwen, tmp_path_factory):
    server = Server(str(tiny_qwen), "-np", "2", "-c", "8192", home=tmp_path_factory.mktemp("server-home"))
    yield server
    assert server.stop() == 0, "".join(server.log)


@pytest.fixture(params=["local", "server"])
def infer_run(request, tiny_qwen):
    """`infer run TINY_QWEN ARGS...`, in this process's model or through a server."""
    env = {}
    if request.param == "server":
        env["INFER_SERVER"] = request.getfixturevalue("tiny_qwen_server").url

    def call(*args, **kw):
        return run_cli("run", tiny_qwen, *args, env={**env, **kw.pop("env", {})}, **kw)

    call.mode, call.env = request.param, env
    return call


def run_json(infer_run, *args, **kw):
    r = infer_run(*args, "--json", **kw)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_same_seed_same_text(infer_run):
    args = ("Hello", "-n", "16", "--seed", "7", "--temp", "0.8")
    first, second = infer_run(*args), infer_run(*args)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    assert len(first.stdout.strip()) > 0
    other = infer_run("Hello", "-n", "16", "--seed", "8", "--temp", "0.8")
    assert other.stdout != first.stdout


def test_greedy_is_deterministic_without_seed(infer_run):
    a = run_json(infer_run, "Hello", "-n", "12", "--temp", "0")
    b = run_json(infer_run, "Hello", "-n", "12", "--temp", "0")
    assert a["text"] == b["text"]


def test_json_result_fields(infer_run):
    out = run_json(infer_run, "Hello there, JSON", "-n", "8", "--seed", "1")
    assert out["finish_reason"] == "length"
    assert out["text"]
    assert out["seed"] == 1
    assert out["usage"]["completion_tokens"] == 8
    assert out["usage"]["prompt_tokens"] > 1
    assert out["usage"]["cached_tokens"] < out["usage"]["prompt_tokens"]
    assert {"draft_tokens", "accepted_tokens"} <= set(out["usage"])
    loaded = ("load_ms",) if infer_run.mode == "local" else ()  # a server's model was loaded before
    for key in (*loaded, "prefill_ms", "decode_ms", "ttft_ms",
                "prefill_tokens_per_second", "decode_tokens_per_second"):
        assert out["timings"][key] > 0, key


def test_the_same_reply_with_and_without_a_server(tiny_qwen, tiny_qwen_server):
    """Greedy, one request at a time: the server's slot decodes as the process does."""
    args = ("run", tiny_qwen, "Tell me about rivers", "-n", "24", "--temp", "0", "--json")
    here = json.loads(run_cli(*args, "--spec-type", "none").stdout)
    there = json.loads(run_cli(*args, env={"INFER_SERVER": tiny_qwen_server.url}).stdout)
    assert there["text"] == here["text"] and there["usage"]["prompt_tokens"] == here["usage"]["prompt_tokens"]


def test_random_seed_is_reported_and_reproduces(infer_run):
    first = run_json(infer_run, "Hi", "-n", "10")
    again = run_json(infer_run, "Hi", "-n", "10", "--seed", str(first["seed"]))
    assert again["text"] == first["text"]


def test_stop_string_ends_output_and_is_not_printed(infer_run):
    full = run_json(infer_run, "Hello", "-n", "24", "--seed", "3")["text"]
    stop = full[len(full) // 2: len(full) // 2 + 3]
    assert stop.strip()
    out = run_json(infer_run, "Hello", "-n", "24", "--seed", "3", "--stop", stop)
    assert out["finish_reason"] == "stop"
    assert out["text"] == full[: full.index(stop)]


def test_max_tokens_limits_output(infer_run):
    out = run_json(infer_run, "Hello", "-n", "5", "--seed", "3")
    assert out["usage"]["completion_tokens"] == 5
    assert out["finish_reason"] == "length"


def test_plain_stdout_ends_with_newline_and_has_no_escape_codes(infer_run):
    r = infer_run("Hello", "-n", "6", "--seed", "5")
    assert r.returncode == 0
    assert r.stdout.endswith("\n")
    assert "\x1b[" not in r.stdout
    assert r.stderr == ""


def test_verbose_reports_statistics_on_stderr(tiny_qwen):
    r = run_cli("run", tiny_qwen, "Hello", "-n", "4", "--seed", "5", "-v")
    assert r.returncode == 0
    assert "completion: 4 tokens" in r.stderr
    assert "tokens/s" in r.stderr
    # llama.cpp's log, whole lines: the load's progress dots come on one line, not one per line
    lines = r.stderr.splitlines()
    assert "llama_context: constructing llama_context" in lines
    assert "." not in lines and any(set(line) == {"."} and len(line) > 1 for line in lines)


def test_verbose_through_a_server_reports_statistics_on_stderr(tiny_qwen, tiny_qwen_server):
    r = run_cli("run", tiny_qwen, "Hello", "-n", "4", "--seed", "5", "-v",
                env={"INFER_SERVER": tiny_qwen_server.url})
    assert r.returncode == 0, r.stderr
    assert "completion: 4 tokens" in r.stderr and "tokens/s" in r.stderr


@pytest.mark.parametrize("flags", [["-c", "512"], ["-t", "1"], ["--spec-type", "none"], ["--explain"],
                                   ["--show-prompt"], ["--no-cache"], ["-fa", "on"]])
def test_flags_a_server_owns_are_usage_errors_through_it(tiny_qwen, tiny_qwen_server, flags):
    r = run_cli("run", tiny_qwen, "Hello", *flags, env={"INFER_SERVER": tiny_qwen_server.url})
    assert_one_line_error(r, 2, flags[0].split("/")[0], "infer serve")


def test_a_server_that_cannot_be_reached_is_exit_4_naming_it(tiny_qwen):
    for where in ["http://127.0.0.1:9", "unix:/nonexistent/infer.sock"]:
        r = run_cli("run", tiny_qwen, "Hello", env={"INFER_SERVER": where})
        assert_one_line_error(r, 4, where)


def test_a_users_own_server_is_found_on_its_unix_socket(tiny_qwen, tiny_qwen_server):
    """`infer serve` also listens on INFER_HOME/serve.sock, which only its user can open;
    INFER_SERVER=unix finds it without a port."""
    sock = tiny_qwen_server.home / "serve.sock"
    assert sock.is_socket() and sock.stat().st_mode & 0o777 == 0o600
    env = {"INFER_HOME": str(tiny_qwen_server.home), "INFER_SERVER": "unix"}
    by_socket = run_cli("run", tiny_qwen, "Hello", "-n", "8", "--temp", "0", env=env)
    by_tcp = run_cli("run", tiny_qwen, "Hello", "-n", "8", "--temp", "0", "--server", tiny_qwen_server.url)
    assert by_socket.returncode == 0, by_socket.stderr
    assert by_socket.stdout == by_tcp.stdout and by_socket.stdout.strip()


def test_the_socket_file_goes_with_its_server(tiny_qwen, tmp_path):
    server = Server(str(tiny_qwen), "-np", "1", "-c", "1024", home=tmp_path)
    assert (tmp_path / "serve.sock").is_socket()
    assert server.stop() == 0
    assert not (tmp_path / "serve.sock").exists()


def test_server_errors_keep_their_exit_codes(tiny_qwen_server):
    env = {"INFER_SERVER": tiny_qwen_server.url}
    assert_one_line_error(run_cli("run", "no-such-model", "Hello", env=env), 3, "no-such-model")
    assert_one_line_error(run_cli("run", "/elsewhere/m.gguf", "Hello", env=env), 3, "path")
    r = run_cli("run", str(tiny_qwen_server.args[0]), "Hello", "-n", "100000", env=env)
    assert_one_line_error(r, 2, "context")


# --- stdin rules (the rendered prompt shows what the model would see) --------

def shown_prompt(model, *args, input=b""):
    r = run_cli("run", model, *args, "--raw", "--show-prompt", input=input)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_stdin_comes_first_then_blank_line_then_prompt(tiny_qwen):
    assert shown_prompt(tiny_qwen, "Summarize.", input=b"line one\nline two\n") == \
        "line one\nline two\n\nSummarize.\n"


def test_dash_prompt_means_stdin_alone(tiny_qwen):
    assert shown_prompt(tiny_qwen, "-", input=b"only stdin") == "only stdin\n"


def test_empty_stdin_uses_prompt_alone(tiny_qwen):
    assert shown_prompt(tiny_qwen, "just this", input=b"") == "just this\n"


def test_stdin_without_prompt_argument(tiny_qwen):
    assert shown_prompt(tiny_qwen, input="from a pipe") == "from a pipe\n"


def test_chat_prompt_uses_model_template_and_system(tiny_qwen):
    r = run_cli("run", tiny_qwen, "Hi", "-s", "Be brief.", "--show-prompt")
    assert r.stdout == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                        "<|im_start|>assistant\n")


def test_binary_stdin_is_a_usage_error(infer_run):
    r = infer_run("x", input=b"\x00\x01\x02binary")
    assert_one_line_error(r, 2, "binary")


def test_non_utf8_stdin_is_a_usage_error(infer_run):
    r = infer_run("x", input=b"caf\xe9 latin-1")
    assert_one_line_error(r, 2, "UTF-8")


def test_no_prompt_at_all_is_a_usage_error(infer_run):
    assert_one_line_error(infer_run(), 2, "no prompt")


def test_dash_with_empty_stdin_is_a_usage_error(infer_run):
    assert_one_line_error(infer_run("-"), 2, "empty")


# --- bad input: each ends with its exit code and one line -----------------------

@pytest.mark.parametrize("flags, fragment", [
    (["--temp", "-1"], "temperature"),
    (["--top-p", "-0.1"], "top-p"),
    (["--top-p", "1.5"], "top-p"),
    (["--top-k", "-3"], "top-k"),
    (["--min-p", "2"], "min-p"),
    (["--mirostat", "3"], "mirostat"),
    (["--seed", "99999999999"], "seed"),
    (["--repeat-last-n", "-5"], "repeat-last-n"),
    (["--json-schema", "{not json"], "JSON schema"),
    (["--json-schema", "[1, 2]"], "JSON schema"),
    (["--json-schema", '{"type": "no-such-type"}'], "schema"),
    (["--json-schema", "@/nonexistent/schema.json"], "no such file"),
    (["--grammar", "root ::= (((("], "grammar"),
    (["--grammar-file", "/nonexistent.gbnf"], "no such file"),
    (["--logit-bias", "abc"], "logit bias"),
    (["--logit-bias", "99999999+1"], "vocabulary"),
    (["--cache-type-k", "q9_9"], "KV cache type"),
    (["-fa", "maybe"], "flash attention"),
    (["-c", "8"], "context size"),
    (["-t", "0"], "thread"),
    (["--chat-template-file", "/nonexistent.jinja"], "no such file"),
    (["--raw", "-s", "system"], "--raw"),
    (["--no-such-flag"], "No such option"),
    (["--temp", "warm"], "--temp"),
])
def test_bad_flag_values_are_usage_errors(tiny_qwen, flags, fragment):
    assert_one_line_error(run_cli("run", tiny_qwen, "Hello", "-n", "4", *flags), 2, fragment)


def test_context_overflow_names_both_counts_and_the_context(tiny_qwen):
    r = run_cli("run", tiny_qwen, "word " * 600, "-c", "256", "-n", "16")
    assert_one_line_error(r, 2, "609 prompt tokens", "+ 16 requested tokens", "context of 256")


def test_requested_tokens_count_towards_the_context(tiny_qwen):
    r = run_cli("run", tiny_qwen, "Hello", "-c", "256", "-n", "300")
    assert_one_line_error(r, 2, "+ 300 requested tokens", "context of 256")


def test_missing_model_file(tmp_path):
    assert_one_line_error(run_cli("run", tmp_path / "nope.gguf", "hi"), 3, "no such file")


def test_unknown_model_reference():
    assert_one_line_error(run_cli("run", "no-such-alias", "hi"), 3, "no such model file, alias",
                          "`infer list --catalog` shows the aliases")


def test_hf_folder_with_an_unknown_architecture(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["T5ForConditionalGeneration"]}')
    assert_one_line_error(run_cli("run", tmp_path, "hi"), 3, "cannot convert architecture")


def test_not_a_gguf_file(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_text("this is not a model\n" * 10)
    assert_one_line_error(run_cli("run", bad, "hi"), 3, "magic")


def test_broken_template_is_a_model_error(tiny_qwen, tmp_path):
    tpl = tmp_path / "t.jinja"
    tpl.write_text("{% for m in messages %}{{ m.content }")
    assert_one_line_error(run_cli("run", tiny_qwen, "hi", "--chat-template-file", tpl), 3,
                          "syntax error")


def test_template_reaching_python_internals_is_refused(tiny_qwen, tmp_path):
    tpl = tmp_path / "evil.jinja"
    tpl.write_text("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    assert_one_line_error(run_cli("run", tiny_qwen, "hi", "--chat-template-file", tpl), 3,
                          "not allowed")


# --- pipes and signals ---------------------------------------------------------

def test_closed_pipe_ends_quietly(infer_run, tiny_qwen):
    cmd = " ".join(f"'{a}'" for a in [*CLI, "run", tiny_qwen, "Hello", "-n", "200",
                                      "--seed", "1", "--ignore-eos"])
    proc = subprocess.run(["bash", "-c", f"set -o pipefail; {cmd} </dev/null | head -c 20"],
                          capture_output=True, timeout=120, env={**os.environ, **infer_run.env})
    assert len(proc.stdout) == 20
    assert proc.stderr == b"", proc.stderr.decode()
    assert proc.returncode == 0


def test_ctrl_c_stops_generation_keeps_text_and_exits_130(infer_run, tiny_qwen):
    # (a server's request may use the model's training context, 2,048 tokens here)
    context = ["-c", "4096", "-n", "3000"] if infer_run.mode == "local" else ["-n", "2000"]
    assert_ctrl_c_keeps_the_text(["run", str(tiny_qwen), "Hello", *context, "--ignore-eos", "--seed", "1"],
                                 env=infer_run.env)
    if infer_run.mode == "server":  # the request was cancelled on the server: its slot is free
        server = infer_run.env["INFER_SERVER"]
        for _ in range(100):
            running = [line for line in httpx.get(server + "/metrics", timeout=10).text.splitlines()
                       if line.startswith("infer:num_requests_running")]
            if running and all(line.endswith(" 0") or line.endswith(" 0.0") for line in running):
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"still running on the server: {running}")
