"""Strict GGUF validation: crafted bad files end with exit 3 and a one-line reason."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_one_line_error, run_cli
from gguf import GGUFWriter

from infer.quant.gguf_check import check_gguf
from infer.runtime.errors import InvalidModelFileError


def gguf_string(s: str) -> bytes:
    data = s.encode()
    return struct.pack("<Q", len(data)) + data


def header(n_tensors: int, n_kv: int, version: int = 3, magic: bytes = b"GGUF") -> bytes:
    return magic + struct.pack("<IQQ", version, n_tensors, n_kv)


def tensor_info(name: str, shape: tuple[int, ...], ggml_type: int, offset: int) -> bytes:
    return (gguf_string(name) + struct.pack("<I", len(shape))
            + b"".join(struct.pack("<Q", d) for d in shape) + struct.pack("<IQ", ggml_type, offset))


def kv_u32(key: str, value: int) -> bytes:
    return gguf_string(key) + struct.pack("<II", 4, value)


def with_data(meta: bytes, data_len: int, alignment: int = 32) -> bytes:
    pad = (-len(meta)) % alignment
    return meta + b"\0" * pad + b"\1" * data_len


@pytest.fixture
def valid_file(tmp_path: Path) -> Path:
    path = tmp_path / "ok.gguf"
    w = GGUFWriter(path, "llama")
    w.add_uint32("test.value", 7)
    w.add_tensor("a", np.ones((4, 8), dtype=np.float32))
    w.add_tensor("b", np.ones((16,), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_valid_file_reports_metadata_and_tensors(valid_file):
    info = check_gguf(valid_file)
    assert info.architecture == "llama"
    assert info.metadata["test.value"] == 7
    assert [(t.name, t.shape, t.nbytes) for t in info.tensors] == [("a", (8, 4), 128), ("b", (16,), 32)]


def test_real_vocabulary_file_passes(fixtures):
    info = check_gguf(fixtures / "vocab" / "ggml-vocab-qwen2.gguf")
    assert info.metadata["tokenizer.ggml.model"] == "gpt2"
    assert len(info.metadata["tokenizer.ggml.tokens"]) == 0  # long arrays are checked, not kept
    assert info.metadata["tokenizer.ggml.tokens"].length == 151936


BAD_FILES = {
    "empty": (b"", "empty"),
    "wrong magic": (header(0, 0, magic=b"GGML") + b"\0" * 32, "wrong magic"),
    "bad version": (header(0, 0, version=99), "unsupported GGUF version 99"),
    "truncated header": (b"GGUF\x03\x00", "truncated"),
    "absurd tensor count": (header(2**40, 0) + b"\0" * 64, "tensor count"),
    "absurd metadata count": (header(0, 2**60) + b"\0" * 64, "metadata count"),
    "string past end": (header(0, 1) + struct.pack("<Q", 10**9) + b"key" + b"\0" * 16,
                        "truncated"),
    "array past end": (header(0, 1) + gguf_string("k") + struct.pack("<IIQ", 9, 4, 2**40),
                       "truncated"),
    "unknown value type": (header(0, 1) + gguf_string("k") + struct.pack("<I", 77), "unknown value type"),
    "tensor past end": (with_data(header(1, 0) + tensor_info("t", (64,), 0, 0), 16), "past the end"),
    "overlapping tensors": (with_data(header(2, 0) + tensor_info("t1", (16,), 0, 0)
                                      + tensor_info("t2", (16,), 0, 32), 128), "overlap"),
    "misaligned tensor": (with_data(header(1, 0) + tensor_info("t", (4,), 0, 3), 64), "aligned"),
    "unknown tensor type": (with_data(header(1, 0) + tensor_info("t", (4,), 999, 0), 64),
                            "unknown type"),
    "too many dimensions": (with_data(header(1, 0) + tensor_info("t", (1, 1, 1, 1, 1), 0, 0), 64),
                            "dimensions"),
    "duplicate tensor": (with_data(header(2, 0) + tensor_info("t", (4,), 0, 0)
                                   + tensor_info("t", (4,), 0, 32), 64), "duplicate tensor"),
    "bad alignment": (with_data(header(0, 1) + kv_u32("general.alignment", 3), 0), "power of two"),
}


@pytest.mark.parametrize("name", BAD_FILES)
def test_bad_files_are_rejected_with_a_reason(tmp_path, name):
    data, reason = BAD_FILES[name]
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(InvalidModelFileError) as err:
        check_gguf(path)
    assert reason in str(err.value)


@pytest.mark.parametrize("name", ["wrong magic", "absurd tensor count", "overlapping tensors",
                                  "tensor past end"])
def test_cli_rejects_bad_files_with_exit_3(tmp_path, name):
    data, reason = BAD_FILES[name]
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    assert_one_line_error(run_cli("run", path, "hi"), 3, reason)


def test_truncated_real_model_is_rejected(tiny_spm, tmp_path):
    cut = tmp_path / "cut.gguf"
    data = tiny_spm.read_bytes()
    cut.write_bytes(data[: len(data) - 1000])
    assert_one_line_error(run_cli("run", cut, "hi"), 3, "past the end")


def test_a_changed_file_is_checked_again(tiny_spm, tmp_path):
    copy = tmp_path / "m.gguf"
    copy.write_bytes(tiny_spm.read_bytes())
    assert run_cli("run", copy, "hi", "-n", "1").returncode == 0  # passes, remembered
    data = copy.read_bytes()
    copy.write_bytes(data[:-1000])  # same path, new size and mtime
    assert_one_line_error(run_cli("run", copy, "hi"), 3, "past the end")


def test_unsupported_architecture_is_named(tmp_path):
    path = tmp_path / "alien.gguf"
    w = GGUFWriter(path, "no-such-arch")
    w.add_tensor("token_embd.weight", np.ones((8, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert_one_line_error(run_cli("run", path, "hi"), 3, "unknown model architecture", "no-such-arch")


def test_missing_tensor_is_named(tmp_path):
    path = tmp_path / "hollow.gguf"
    w = GGUFWriter(path, "llama")
    w.add_uint32("llama.context_length", 64)
    w.add_tensor("output_norm.weight", np.ones((8,), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = run_cli("run", path, "hi")
    assert r.returncode == 3 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
