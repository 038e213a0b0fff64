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
    assert "mean KL divergence" in r.stderr and "top-1 agreement" in r.stderr  # (the quality check)
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


def write_imatrix(model, path, *, legacy=False):
    """An importance matrix for every matrix weight of `model`, in either file format."""
    import struct

    import numpy as np
    from gguf import GGUFWriter

    from infer.quant.gguf_check import check_gguf

    rng = np.random.default_rng(0)
    weights = [(t.name, t.shape[0]) for t in check_gguf(model).tensors
               if len(t.shape) == 2 and t.name != "token_embd.weight"]
    if legacy:
        out = struct.pack("<i", len(weights))
        for name, n in weights:
            raw = name.encode()
            out += struct.pack("<i", len(raw)) + raw + struct.pack("<ii", 1, n)
            out += rng.uniform(0.1, 2.0, n).astype(np.float32).tobytes()
        path.write_bytes(out + struct.pack("<ii", 1, 0))
        return path
    w = GGUFWriter(path, "imatrix")
    w.add_array("imatrix.datasets", ["test"])
    w.add_uint32("imatrix.chunk_count", 1)
    w.add_uint32("imatrix.chunk_size", 512)
    for name, n in weights:
        w.add_tensor(f"{name}.in_sum2", rng.uniform(1.0, 20.0, (1, n)).astype(np.float32))
        w.add_tensor(f"{name}.counts", np.array([[10.0]], dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("legacy, quant", [(False, "IQ2_XXS"), (True, "IQ2_XS")],
                         ids=["gguf-imatrix", "legacy-dat"])
def test_importance_matrix_enables_the_smallest_types(tiny_qwen, tmp_path, infer_home, legacy, quant):
    imatrix = write_imatrix(tiny_qwen, tmp_path / ("m.dat" if legacy else "m.gguf"), legacy=legacy)
    r = run_cli("quantize", tiny_qwen, "--type", quant, "--imatrix", imatrix, "--no-check")
    assert r.returncode == 0, r.stderr
    ran = run_cli("run", f"tiny-qwen2-{quant}", "Hello", "-n", "3")
    assert ran.returncode == 0, ran.stderr


def test_a_file_that_is_no_importance_matrix_is_a_usage_error(tiny_spm, tmp_path):
    bad = tmp_path / "bad.imatrix"
    bad.write_bytes(b"\x05\x00\x00\x00garbage")
    assert_one_line_error(run_cli("quantize", tiny_spm, "--type", "IQ2_XXS", "--imatrix", bad), 2,
                          "importance matrix")
