"""`infer doctor`: what the installation can use, in a table and as JSON."""

from __future__ import annotations

import json
from importlib.metadata import version

from conftest import assert_one_line_error, run_cli
from hub_server import HubServer

from infer.cli.doctor import problems
from infer.cli.rebuild import rebuild_hint


def test_json_has_every_field(infer_home):
    (infer_home / "cache").mkdir(parents=True)
    (infer_home / "cache" / "blob").write_bytes(b"x" * 5000)
    r = run_cli("doctor", "--json", "--hub-timeout", "2")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["llama_cpp_python"] == version("llama_cpp_python")
    assert info["llama_cpp"] and info["infer"]
    assert "CPU" in info["backends"]
    assert info["rpc"] is True  # the README's install command builds the RPC backend
    cpu = [d for d in info["devices"] if d["type"] == "cpu"]
    assert cpu and 0 < cpu[0]["free_bytes"] <= cpu[0]["total_bytes"]
    assert info["threads"]["default"] >= 1 and info["memory"]["available_bytes"] > 0
    assert info["infer_home"]["path"] == str(infer_home) and info["infer_home"]["size_bytes"] >= 5000
    assert info["hf_cache"]["exists"] is False
    # the tests' Hub address refuses connections: unreachable, and said so with the fix
    assert info["hub"]["reachable"] is False and info["hub"]["offline"] is False
    assert any("Hub" in p["problem"] and "HF_HUB_OFFLINE=1" in p["fix"] for p in info["problems"])


def test_offline_mode_is_reported_and_not_a_problem():
    r = run_cli("doctor", "--json", env={"HF_HUB_OFFLINE": "1"})
    info = json.loads(r.stdout)
    assert info["hub"]["offline"] is True and info["hub"]["reachable"] is None
    assert not any("Hub" in p["problem"] for p in info["problems"])


def test_a_reachable_hub():
    with HubServer() as hub:
        r = run_cli("doctor", "--json", env={"HF_ENDPOINT": hub.endpoint})
    info = json.loads(r.stdout)
    assert info["hub"]["reachable"] is True, info["hub"]
    assert not any("Hub" in p["problem"] for p in info["problems"])


def test_screen_names_each_section():
    r = run_cli("doctor")
    assert r.returncode == 0, r.stderr
    for word in ("llama.cpp", "backends:", "CPU features:", "devices", "infer home:",
                 "Hugging Face cache:", "Hub:", "threads:"):
        assert word in r.stdout, word


def test_problems_say_how_to_rebuild():
    info = {"backends": ["CPU"], "rpc": False, "cpu_features": ["AVX", "AVX2"],
            "hub": {"offline": False, "reachable": True},
            "infer_home": {"disk_free_bytes": 100 << 30, "path": "/h"},
            "hf_cache": {"disk_free_bytes": 1 << 30, "path": "/c"}}
    found = problems(info, gpu="CUDA", cpu_flags={"avx", "avx2", "avx512f"})
    text = "\n".join(f"{p['problem']} -> {p['fix']}" for p in found)
    assert "GPU that llama.cpp can use (CUDA)" in text and '-DGGML_CUDA=ON -DGGML_RPC=ON' in text
    assert "without the RPC backend" in text
    assert "AVX512" in text
    assert "1.0 GiB free" in text
    assert rebuild_hint(gpu="METAL").startswith('CMAKE_ARGS="-DGGML_METAL=ON -DGGML_RPC=ON" pip install')


def test_a_bad_hub_timeout_is_a_usage_error():
    assert_one_line_error(run_cli("doctor", "--hub-timeout", "-1"), 2, "--hub-timeout")
