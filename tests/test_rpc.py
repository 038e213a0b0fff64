"""Models split across machines with llama.cpp's RPC backend: `infer worker` and --rpc,
on loopback."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import time
from collections.abc import Iterator

import numpy as np
import pytest
from conftest import CLI, assert_one_line_error, run_cli

PROMPT = "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_procs: dict[str, subprocess.Popen] = {}  # endpoint -> its worker process, while it runs


@contextlib.contextmanager
def workers(n: int, *extra: str) -> Iterator[list[str]]:
    procs: list[subprocess.Popen] = []
    endpoints: list[str] = []
    try:
        for _ in range(n):
            port = free_port()
            procs.append(subprocess.Popen([*CLI, "worker", "--port", str(port), "-t", "1", *extra],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
            endpoints.append(f"127.0.0.1:{port}")
        for proc, endpoint in zip(procs, endpoints, strict=True):
            deadline = time.monotonic() + 30
            while True:
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                with contextlib.suppress(OSError), socket.create_connection(
                        ("127.0.0.1", int(endpoint.rsplit(":", 1)[1])), timeout=1):
                    break
                assert time.monotonic() < deadline, f"worker {endpoint} did not start"
                time.sleep(0.1)
        _procs.update(zip(endpoints, procs, strict=True))
        yield endpoints
    finally:
        for endpoint in endpoints:
            _procs.pop(endpoint, None)
        for proc in procs:
            proc.kill()
            proc.wait()


def _logits(path, devices, tensor_split=()):
    from infer.runtime.llama import Batch, Context, Model
    from infer.runtime.params import ContextParams

    with Model(path, n_gpu_layers=-1, devices=devices, tensor_split=tensor_split) as model, \
            Context(model, ContextParams(n_ctx=256, n_batch=256)) as ctx:
        tokens = model.tokenize(PROMPT, add_special=True, parse_special=False)
        batch = Batch(256)
        batch.set_tokens(tokens, start_pos=0)
        ctx.decode(batch)
        first = np.array(ctx.logits(-1), dtype=np.float32)
        batch.set_one(int(first.argmax()), len(tokens))
        ctx.decode(batch)
        second = np.array(ctx.logits(-1), dtype=np.float32)
        batch.close()
        return np.stack([first, second]), dict(model.placement)


def test_logits_over_two_workers_match_a_local_run(tiny_llama):
    from infer.runtime import ggml

    local, placed_locally = _logits(tiny_llama, devices=[])
    assert set(placed_locally.values()) == {"CPU"}
    with workers(2) as endpoints:
        remote = ggml.add_workers(endpoints)
        assert [d.description for d in remote] == endpoints and all(d.remote for d in remote)
        split, placement = _logits(tiny_llama, [d.handle for d in remote], tensor_split=(1, 1))
    # both workers hold layers: 2 layers + the output layer, split half and half
    assert {placement[0], placement[1], placement[2]} == {d.name for d in remote}
    err = np.abs(split - local).max() / np.abs(local).max()
    assert err <= 1e-3, err


def test_infer_run_over_workers_generates_what_a_local_run_does(tiny_llama):
    args = ["run", tiny_llama, "-n", "12", "--temp", "0", "--no-cache", PROMPT]
    local = run_cli(*args)
    assert local.returncode == 0, local.stderr
    with workers(2) as endpoints:
        r = run_cli(*args, "--rpc", ",".join(endpoints), "-v")
        explained = run_cli("run", tiny_llama, "--rpc", ",".join(endpoints), "--explain", "-ts", "1,3")
    assert r.returncode == 0, r.stderr
    assert r.stdout == local.stdout
    placement = next(line for line in r.stderr.splitlines() if line.startswith("placement:"))
    for endpoint in endpoints:
        assert endpoint in placement, placement
    assert explained.returncode == 0, explained.stderr
    assert "tensor split 1,3" in explained.stdout
    assert endpoints[1] in explained.stdout


def test_unreachable_worker_is_named(tiny_llama):
    port = free_port()
    r = run_cli("run", tiny_llama, "--rpc", f"127.0.0.1:{port}", "-n", "4", "hi", timeout=60)
    assert_one_line_error(r, 4, f"127.0.0.1:{port}", "unreachable")


def test_worker_killed_mid_generation_is_an_error_not_a_hang(tiny_llama):
    with workers(1) as (endpoint,):
        proc = subprocess.Popen([*CLI, "run", tiny_llama, "--rpc", endpoint, "--ignore-eos", "-c", "4096",
                                 "-n", "4000", "--no-cache", "Once upon a time"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None
        proc.stdout.read(16)  # it is generating
        _procs[endpoint].kill()
        try:
            _, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
    stderr = err.decode()
    assert proc.returncode == 4, stderr
    assert f"RPC worker {endpoint} stopped answering" in stderr
    assert "Traceback" not in stderr and "core dumped" not in stderr


def test_worker_warns_off_loopback_and_refuses_a_busy_port():
    port = free_port()
    proc = subprocess.Popen([*CLI, "worker", "--host", "0.0.0.0", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline().decode()
        assert "no authentication" in first, first
        deadline = time.monotonic() + 30
        while True:  # the port is taken once the server listens
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            assert time.monotonic() < deadline
            time.sleep(0.1)
        busy = run_cli("worker", "--port", port)
        assert_one_line_error(busy, 5, f"127.0.0.1:{port}")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail("infer worker did not stop on Ctrl-C")
    assert proc.returncode == 130


def test_run_serve_and_workers_give_the_same_greedy_text_on_the_embedded_model(smollm2, tmp_path):
    """One rule for flash attention wherever the layers run: llama.cpp's own "auto" turned it
    on for loopback workers (they report themselves GPUs) and off here, so the same greedy
    run printed two texts (with -fa on, this prompt's text parts from -fa off's). Served, the
    first request prefills its prompt as one batch as `infer run --no-cache` does. Speculation
    is off on every side: its guesses depend on a cost measured on each side, and a step that
    verifies guesses rounds otherwise than a step of one token (tests/real_model.py)."""
    import httpx
    from serve_helpers import Server

    prompt, n = "Once upon a time", 48
    args = ["run", smollm2, "-n", str(n), "--temp", "0", "--no-cache", "--spec-type", "none", prompt]
    local = run_cli(*args, "-v")
    assert local.returncode == 0, local.stderr
    assert "flash attention: off (auto" in local.stderr
    with workers(2) as endpoints:
        remote = run_cli(*args, "--rpc", ",".join(endpoints), "-v", timeout=300)
    assert remote.returncode == 0, remote.stderr
    assert "flash attention: off (auto" in remote.stderr
    server = Server(str(smollm2), "-np", "1", "--spec-type", "none", home=tmp_path / "home")
    try:
        r = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": prompt}], "max_tokens": n, "temperature": 0})
        assert r.status_code == 200, r.text
        served = r.json()["choices"][0]["message"]["content"]
    finally:
        assert server.stop() == 0, "".join(server.log)
    assert remote.stdout == local.stdout
    assert served == local.stdout.rstrip("\n")
