"""`infer batch`: JSONL in, JSONL out, several prompts decoded together."""

from __future__ import annotations

import json
import signal
import subprocess
import time

from conftest import CLI, assert_one_line_error, run_cli

PROMPTS = ["The capital of France is", "Roses are red,", "1, 2, 3, 4,", "Once upon a time",
           "SELECT name FROM", "The sea is"]


def results(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines()]


def test_one_at_a_time_each_line_equals_infer_run(tiny_llama):
    lines = [{"id": f"g{i}", "prompt": p, "temperature": 0} for i, p in enumerate(PROMPTS[:3])]
    lines += [{"id": f"s{i}", "prompt": p, "temperature": 0.9, "seed": 7 + i}
              for i, p in enumerate(PROMPTS[:3])]
    r = run_cli("batch", tiny_llama, "--parallel", "1", "-n", "8",
                input="".join(json.dumps(line) + "\n" for line in lines))
    assert r.returncode == 0, r.stderr
    got = {res["id"]: res["text"] for res in results(r.stdout)}
    for line in lines:
        flags = ["--temp", str(line["temperature"])]
        if "seed" in line:
            flags += ["--seed", str(line["seed"])]
        alone = json.loads(run_cli("run", tiny_llama, "--json", "--no-cache", "-n", "8", *flags,
                                   line["prompt"]).stdout)
        assert got[line["id"]] == alone["text"], line


def test_results_keep_input_order_unless_unordered(tiny_llama):
    text = "".join(f"{p}\n" for p in PROMPTS)
    ordered = run_cli("batch", tiny_llama, "--lines", "--parallel", "4", "-n", "4", "--temp", "0", input=text)
    assert [res["id"] for res in results(ordered.stdout)] == [1, 2, 3, 4, 5, 6]
    unordered = run_cli("batch", tiny_llama, "--lines", "--parallel", "4", "-n", "4", "--temp", "0",
                        "--unordered", input=text)
    assert sorted(res["id"] for res in results(unordered.stdout)) == [1, 2, 3, 4, 5, 6]
    assert {res["id"]: res["text"] for res in results(unordered.stdout)} == {
        res["id"]: res["text"] for res in results(ordered.stdout)}


def test_bad_lines_get_error_objects_and_the_batch_goes_on(tiny_llama):
    text = "\n".join([
        json.dumps({"id": "ok", "prompt": "Hello"}),
        "this is not json",
        json.dumps({"id": "no-prompt", "text": "Hello"}),
        json.dumps({"id": "too-long", "prompt": "word " * 3000}),
        json.dumps({"id": "bad-temp", "prompt": "Hi", "temperature": -1}),
        json.dumps({"id": "ok2", "messages": [{"role": "user", "content": "Hi"}]}),
    ]) + "\n"
    r = run_cli("batch", tiny_llama, "-n", "3", "--parallel", "2", "-c", "2048", input=text)
    assert r.returncode == 2
    by_id = {res["id"]: res for res in results(r.stdout)}
    assert set(by_id) == {"ok", 2, "no-prompt", "too-long", "bad-temp", "ok2"}
    assert "text" in by_id["ok"] and "text" in by_id["ok2"]
    assert "not JSON" in by_id[2]["error"]
    assert "prompt" in by_id["no-prompt"]["error"]
    assert "tokens of context" in by_id["too-long"]["error"] and "may use" in by_id["too-long"]["error"]
    assert "temperature" in by_id["bad-temp"]["error"]


def test_lines_of_mixed_lengths_all_complete_in_one_pool(tiny_llama):
    """Three lines of 1,200 tokens among twelve short ones, 8 at a time in 4,096 cells: a
    long line needs more than a stream's share (455 cells), so the batch's KV cache is one
    pool, and every line gets its reply (split streams refused the long ones)."""
    lines = [{"id": f"long{i}", "prompt": f"{i} " + "word " * 1200, "max_tokens": 8} for i in range(3)]
    lines += [{"id": i, "prompt": f"Question {i}: what is {i} plus {i}?", "max_tokens": 8} for i in range(12)]
    text = "".join(json.dumps(line) + "\n" for line in lines)
    r = run_cli("batch", tiny_llama, "--parallel", "8", "-c", "4096", "--temp", "0", "--ignore-eos",
                input=text)
    assert r.returncode == 0, r.stderr
    by_id = {res["id"]: res for res in results(r.stdout)}
    assert set(by_id) == {line["id"] for line in lines}
    assert all(res.get("error") is None and res["usage"]["completion_tokens"] == 8 for res in by_id.values())


def test_a_shared_system_prompt_is_prefilled_once(tiny_llama):
    system = "You are a careful assistant. Answer every question in one short sentence. " * 3
    r = run_cli("batch", tiny_llama, "--lines", "-s", system, "-n", "2", "--temp", "0", "-v",
                input="".join(f"{p}\n" for p in PROMPTS))
    assert r.returncode == 0, r.stderr
    cached = {res["usage"]["cached_tokens"] for res in results(r.stdout)}
    assert len(cached) == 1 and cached.pop() > 40  # every line started from the same copied prefix
    assert "a shared prefix of" in r.stderr


def test_ctrl_c_keeps_finished_results_and_resume_completes_the_file(tiny_llama, tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"id": i, "prompt": PROMPTS[i % 6]}) + "\n" for i in range(30)))
    out = tmp_path / "out.jsonl"
    args = ["batch", tiny_llama, str(source), "-o", str(out), "--parallel", "2", "-n", "300", "--ignore-eos",
            "--temp", "0"]
    proc = subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while (not out.exists() or out.read_text().count("\n") < 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    kept = results(out.read_text())
    assert 2 <= len(kept) < 30
    r = run_cli(*args, "--resume", "-n", "2")
    assert r.returncode == 0, r.stderr
    ids = [res["id"] for res in results(out.read_text())]
    assert sorted(ids) == list(range(30))  # none lost, none twice
    assert ids[:len(kept)] == [res["id"] for res in kept]


def test_usage_errors(tiny_llama, tmp_path):
    assert_one_line_error(run_cli("batch", tiny_llama, str(tmp_path / "missing.jsonl")), 2, "no such file")
    assert_one_line_error(run_cli("batch", tiny_llama, "--resume", input="x\n"), 2, "--resume needs")
    assert_one_line_error(run_cli("batch", tiny_llama, "--lines", "--template", "no slot", input="x\n"), 2,
                          "{line}")
    assert_one_line_error(run_cli("batch", tiny_llama, "--parallel", "0", input="x\n"), 2, "--parallel")


def test_default_parallel_follows_model_size_and_context():
    from infer.runtime.loading import default_parallel

    assert default_parallel(500_000_000, None) == 16
    assert default_parallel(8_000_000_000, None) == 8
    assert default_parallel(70_000_000_000, None) == 4
    assert default_parallel(500_000_000, 4096) == 4  # at least 1,024 tokens each
    assert default_parallel(500_000_000, 512) == 1


def test_binary_stdin_is_a_usage_error(tiny_llama):
    assert_one_line_error(run_cli("batch", tiny_llama, input=b"\x00\x01\x02"), 2, "binary")


def test_through_a_server_each_line_gets_the_same_result(tiny_llama, tmp_path):
    """INFER_SERVER: the lines go to a running `infer serve` (several in flight) and come back
    as the same JSONL, in input order, a bad line failing alone (exit 2)."""
    from serve_helpers import Server

    lines = [{"id": f"g{i}", "prompt": p, "temperature": 0} for i, p in enumerate(PROMPTS[:4])]
    lines += [{"id": "seeded", "prompt": PROMPTS[4], "temperature": 0.9, "seed": 11},
              {"id": "hot", "prompt": "x", "temperature": -1}]
    text = "".join(json.dumps(line) + "\n" for line in lines) + "not json\n"
    here = run_cli("batch", tiny_llama, "--parallel", "1", "-n", "8", "--spec-type", "none", input=text)
    server = Server(str(tiny_llama), "-np", "1", "-c", "2048", "--spec-type", "none", home=tmp_path)
    try:
        there = run_cli("batch", tiny_llama, "--parallel", "4", "-n", "8", input=text,
                        env={"INFER_SERVER": server.url})
        gone = run_cli("batch", tiny_llama, input=text, env={"INFER_SERVER": "http://127.0.0.1:9"})
    finally:
        assert server.stop() == 0
    assert here.returncode == there.returncode == 2, there.stderr
    ours, theirs = results(here.stdout), results(there.stdout)
    assert [r["id"] for r in theirs] == [r["id"] for r in ours] == [*(line["id"] for line in lines), 7]
    for a, b in zip(ours, theirs, strict=True):
        assert ("error" in a) == ("error" in b), (a, b)
        if "error" not in a:
            assert b["text"] == a["text"], (a, b)
            assert b["usage"]["completion_tokens"] == a["usage"]["completion_tokens"]
    assert_one_line_error(gone, 4, "http://127.0.0.1:9")


def test_a_malformed_server_address_is_one_usage_error(tiny_llama):
    r = run_cli("batch", tiny_llama, input='{"id": "a", "prompt": "hi"}\n', env={"INFER_SERVER": "ftp://x"})
    assert_one_line_error(r, 2, "not a server address")
    assert r.stdout == ""  # not an error object per line
