"""Weight repacking (llama.cpp's extra buffer types): checked once in a child process, off
where the check dies (an Intel Xeon whose AMX kernels crash), off by hand with -nr.

The crash is made on any CPU: INFER_TEST_REPACK_CRASH makes the check's child kill itself
with SIGILL where a broken kernel would (runtime/repack_probe.py). The model is the check's
own (runtime/repack_probe.py): a layer per weight type that some extra buffer type takes,
so that llama.cpp repacks some of it on every CPU these tests run on.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from conftest import run_cli

from infer.cli.rebuild import rebuild_without
from infer.runtime import repack
from infer.runtime.repack import Verdict
from infer.runtime.repack_probe import build_model

# llama.cpp's load log: "load_tensors:   CPU_REPACK model buffer size =     1.43 MiB"
BUFFER_LINE = re.compile(r"(\S+) model buffer size")
MEMO_NAME = "repack-check.json"  # where infer keeps the check's verdicts in INFER_HOME


@pytest.fixture(scope="module")
def extra() -> list[str]:
    """This build's extra buffer types: the tests need one to repack into."""
    names = repack.extra_buffer_types()
    assert names, "this llama.cpp build has no extra buffer types (GGML_CPU_REPACK is on by default)"
    return names


@pytest.fixture(scope="module")
def probe_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("repack") / "probe.gguf"
    build_model(path)
    return path


def loaded_into(stderr: str) -> set[str]:
    """The buffers llama.cpp put the model's weights in, from the -v load log."""
    return {m.group(1) for line in stderr.splitlines() if line.startswith("load_tensors:")
            for m in [BUFFER_LINE.search(line)] if m}


def repack_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "weight repacking is off" in line]


def forget_the_check(home: Path) -> None:
    (home / MEMO_NAME).unlink(missing_ok=True)


@pytest.fixture(scope="module")
def works_here(repack_memo: bytes | None) -> bool:
    """What the session's check found on this machine (conftest.py): True on an AMD EPYC, False
    on an Intel Xeon whose AMX kernels crash."""
    assert repack_memo is not None
    (found,) = json.loads(repack_memo)["checks"].values()
    assert found["outcome"] in (Verdict.WORKS, Verdict.CRASHED), found
    return found["outcome"] == Verdict.WORKS


def test_the_first_run_checks_and_loads_as_the_check_says(probe_model, extra, infer_home, works_here):
    forget_the_check(infer_home)
    r = run_cli("run", probe_model, "hello", "-n", "2", "--temp", "0", "-v")
    assert r.returncode == 0, r.stderr
    kept = json.loads((infer_home / MEMO_NAME).read_text())["checks"]
    assert [v["outcome"] for v in kept.values()] == ["works" if works_here else "crashed"]
    if works_here:  # e.g. CPU_REPACK on AVX2, AMX on a Xeon whose AMX works
        assert loaded_into(r.stderr) & set(extra), r.stderr
        assert repack_lines(r.stderr) == []
    else:
        assert not loaded_into(r.stderr) & set(extra), r.stderr
        assert len(repack_lines(r.stderr)) == 1


def test_a_check_that_dies_turns_repacking_off_and_the_run_succeeds(probe_model, extra, infer_home,
                                                                    works_here):
    forget_the_check(infer_home)
    crash = {"INFER_TEST_REPACK_CRASH": "1"}
    r = run_cli("run", probe_model, "hello", "-n", "2", "--temp", "0", "-v", env=crash)
    assert r.returncode == 0, r.stderr
    assert not loaded_into(r.stderr) & set(extra), r.stderr
    assert "CPU_Mapped" in loaded_into(r.stderr)  # (the log was read: the weights are somewhere)
    said = repack_lines(r.stderr)
    assert len(said) == 1 and "crashed" in said[0] and "SIGILL" in said[0] and "infer doctor" in said[0]
    # Remembered: later runs neither check again nor repack, and say why under -v only.
    again = run_cli("run", probe_model, "hello", "-n", "2", "--temp", "0", "-v")
    assert again.returncode == 0 and not loaded_into(again.stderr) & set(extra), again.stderr
    assert len(repack_lines(again.stderr)) == 1
    quiet = run_cli("run", probe_model, "hello", "-n", "2", "--temp", "0")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    # infer doctor says so, with the fix; --recheck finds that it works after all.
    doctor = run_cli("doctor", "--json")
    info = json.loads(doctor.stdout)
    assert info["repack"]["on"] is False and info["repack"]["check"] == "crashed"
    fix = [p["fix"] for p in info["problems"] if "repack" in p["problem"]]
    assert len(fix) == 1 and "--no-cache-dir" in fix[0] and "CMAKE_ARGS=" in fix[0]
    screen = run_cli("doctor").stdout
    assert "weight repacking: off" in screen and "SIGILL" in screen
    rechecked = json.loads(run_cli("doctor", "--json", "--recheck").stdout)
    assert rechecked["repack"]["on"] is works_here
    assert any("repack" in p["problem"] for p in rechecked["problems"]) is not works_here


def test_no_repack_reaches_llama_cpp(probe_model, extra, works_here):
    usual = run_cli("run", probe_model, "hello", "-n", "2", "--temp", "0", "-v")
    assert bool(loaded_into(usual.stderr) & set(extra)) is works_here, usual.stderr
    for args, env in ((["-nr"], None), (["--no-repack"], None), ([], {"INFER_NO_REPACK": "1"})):
        r = run_cli("run", probe_model, "hello", "-n", "2", "--temp", "0", "-v", *args, env=env)
        assert r.returncode == 0, r.stderr
        assert not loaded_into(r.stderr) & set(extra), (args, env, r.stderr)
        assert len(repack_lines(r.stderr)) == 1 and "as asked" in r.stderr
    bench = run_cli("bench", probe_model, "-p", "8", "-n", "2", "-r", "1", "-nr", "-v")
    assert bench.returncode == 0 and not loaded_into(bench.stderr) & set(extra), bench.stderr
    batch = run_cli("batch", probe_model, "--lines", "-n", "2", "-nr", "-v", input="a\nb\n")
    assert batch.returncode == 0 and not loaded_into(batch.stderr) & set(extra), batch.stderr
    assert len(batch.stdout.splitlines()) == 2


@pytest.mark.parametrize("command", ["run", "chat", "batch", "serve", "bench", "quantize"])
def test_every_command_that_loads_a_model_takes_no_repack(command):
    r = run_cli(command, "--help", env={"COLUMNS": "200"})
    assert r.returncode == 0 and "--no-repack" in r.stdout and "-nr" in r.stdout, r.stdout


def test_the_quality_check_of_quantize_loads_as_asked(monkeypatch, tmp_path):
    """infer quantize's check opens both models through Session.open with these settings (a
    chat model's: it reads their headers first, to tell an embedding model)."""
    import shutil

    from tiny_model import build_llama_gguf

    from infer.quant import check

    build_llama_gguf(tmp_path / "a.gguf")
    shutil.copy(tmp_path / "a.gguf", tmp_path / "b.gguf")

    seen: list[bool] = []

    class Stop(Exception):
        pass

    def session_open(path, params, **kw):
        seen.append(params.repack)
        raise Stop

    monkeypatch.setattr("infer.runtime.session.Session.open", session_open)
    for wanted in (True, False):
        with pytest.raises(Stop):
            check.quality(tmp_path / "a.gguf", tmp_path / "b.gguf", repack=wanted)
    assert seen == [True, False]


# -- the check itself, in this process ---------------------------------------------------------

@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A process state that has not checked yet, remembering in a file in tmp_path (returned)."""
    memo = tmp_path / MEMO_NAME
    monkeypatch.setattr(repack, "_settled", None)
    monkeypatch.setattr(repack, "_memo", lambda: memo)
    return memo


def test_the_verdict_is_kept_per_build_cpu_and_kernel(fresh, monkeypatch, extra, works_here):
    found = repack.verdict()
    assert found.outcome == (Verdict.WORKS if works_here else Verdict.CRASHED)
    assert found.repack is works_here and found.buffers == tuple(extra)
    memo = json.loads(fresh.read_text())["checks"]
    assert list(memo) == [repack.machine_key()]
    # Remembered: no child process the second time.
    monkeypatch.setattr(repack, "_settled", None)
    monkeypatch.setattr(repack, "check", lambda buffers: pytest.fail("checked again"))
    assert repack.verdict().outcome == found.outcome
    # Another kernel (or CPU, or build) is another key.
    key = repack.machine_key()
    monkeypatch.setattr(repack.platform, "release", lambda: "0.0-other")
    assert repack.machine_key() != key


def test_a_rebuilt_library_is_checked_again(tmp_path, monkeypatch):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libggml-cpu.so").write_bytes(b"one build")
    monkeypatch.setattr(repack, "_library_folder", lambda: lib)
    before = repack.machine_key()
    (lib / "libggml-cpu.so").write_bytes(b"another build")
    assert repack.machine_key() != before


def test_a_check_that_cannot_run_leaves_repacking_on_and_says_why(fresh, monkeypatch, extra):
    monkeypatch.setattr(sys, "executable", "/bin/false")
    found = repack.verdict()
    assert found.outcome == Verdict.UNKNOWN and found.repack and "exit 1" in found.detail
    assert fresh.exists()  # not tried on every run: doctor --recheck tries again


def test_a_check_that_hangs_is_not_remembered(fresh, monkeypatch, extra):
    monkeypatch.setattr(repack, "CHECK_TIMEOUT_S", 0.01)
    found = repack.verdict()
    assert found.outcome == Verdict.UNKNOWN and found.repack and "did not finish" in found.detail
    assert not fresh.exists()


def test_a_damaged_memo_is_checked_again(fresh, extra, works_here):
    fresh.write_text("{not json")
    assert repack.verdict().repack is works_here
    assert json.loads(fresh.read_text())["checks"]


def test_the_rebuild_leaves_out_what_crashed():
    # (the names /proc/cpuinfo gives: avx512vbmi has no underscore, avx512_vnni has one)
    flags = {"avx", "avx2", "fma", "f16c", "avx512f", "avx512vbmi", "avx512_vnni", "amx_int8", "amx_tile"}
    amx = rebuild_without(["AMX", "CPU_REPACK"], flags, None)
    assert amx.startswith('CMAKE_ARGS="-DGGML_NATIVE=OFF ') and "--no-cache-dir" in amx
    for wanted in ("-DGGML_AVX2=ON", "-DGGML_AVX512=ON", "-DGGML_AVX512_VBMI=ON", "-DGGML_AVX512_VNNI=ON",
                   "-DGGML_AMX_INT8=OFF", "-DGGML_RPC=ON"):
        assert wanted in amx
    assert "-DGGML_AVX512_BF16" not in amx  # this CPU has no AVX512-BF16
    from importlib.metadata import version

    # the installed version, built again (pip would take the newest, untested with infer)
    assert amx.endswith(f"--no-deps llama-cpp-python=={version('llama-cpp-python')}")
    other = rebuild_without(["CPU_REPACK"], {"avx2"}, "CUDA")
    assert "-DGGML_CPU_REPACK=OFF" in other and "-DGGML_CUDA=ON" in other and "NATIVE" not in other
