"""`infer quantize` on GGUF sources: every file type by name, runs by name, nothing left on failure."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from conftest import CLI, assert_one_line_error, run_cli


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_K_M"])
def test_quantized_gguf_runs_by_name(tiny_qwen, infer_home, quant):
    r = run_cli("quantize", tiny_qwen, "--type", quant.lower())
    assert r.returncode == 0, r.stderr
    out = infer_home / "models" / f"tiny-qwen2-{quant}.gguf"
    assert r.stdout.strip() == str(out)
    assert out.stat().st_size < tiny_qwen.stat().st_size
    assert f"infer run {out.stem}" in r.stderr
    ran = run_cli("run", out.stem, "Hello", "-n", "4", "--seed", "1")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]


def test_output_path_option(tiny_spm, tmp_path):
    out = tmp_path / "custom.gguf"
    r = run_cli("quantize", tiny_spm, "--type", "Q8_0", "-o", out)
    assert r.returncode == 0, r.stderr
    assert out.is_file()


def test_unknown_type_lists_the_valid_ones(tiny_spm):
    assert_one_line_error(run_cli("quantize", tiny_spm, "--type", "Q9_9"), 2,
                          "unknown quant type", "Q4_K_M", "IQ4_XS")


def test_types_that_need_an_importance_matrix(tiny_spm):
    assert_one_line_error(run_cli("quantize", tiny_spm, "--type", "IQ2_XXS"), 2, "importance matrix")


def test_missing_source(tmp_path):
    assert_one_line_error(run_cli("quantize", tmp_path / "nothing", "--type", "Q8_0"), 3, "no such")


def test_ctrl_c_mid_quantization_leaves_nothing(tiny_qwen, infer_home):
    proc = subprocess.Popen([*CLI, "quantize", str(tiny_qwen), "--type", "Q4_K_M"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=os.environ.copy())
    models = infer_home / "models"
    partial = models / ".tiny-qwen2-Q4_K_M.gguf.partial"
    deadline = time.monotonic() + 60
    while not partial.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert partial.exists(), "the quantizer never started writing"
    proc.send_signal(signal.SIGINT)  # mid-quantization: the output is being written
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert not models.exists() or list(models.iterdir()) == []
