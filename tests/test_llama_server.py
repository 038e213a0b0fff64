"""infer serve against llama.cpp's own llama-server on the same GGUF file, chat template and
request (greedy, the same flash-attention and repacking settings): what a client reads must be
the same. llama-server is built from the installed llama-cpp-python's source distribution by
`benchmarks/build_llama_tools.sh llama-server`, which the README's test command runs first
(about 5 minutes once; a no-op after). benchmarks/reasoning_parity.py prints the same
comparison for any model.
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest
from conftest import llama_tool
from serve_helpers import Server, healthy, reply_parts
from tiny_model import fixtures_dir

TEMPLATES = fixtures_dir() / "chat-templates"


@pytest.fixture(scope="module")
def llama_server() -> Path:
    return llama_tool("llama-server")


class LlamaServer:
    """llama-server on a free port of 127.0.0.1, its log kept for a failure's message."""

    def __init__(self, binary: Path, *args: str, log: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.log, self._out = log, log.open("wb")
        self.proc = subprocess.Popen([str(binary), *args, "--host", "127.0.0.1", "--port", str(port)],
                                     stdin=subprocess.DEVNULL, stdout=self._out, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}"
        if not healthy(self.url, 120, alive=lambda: self.proc.poll() is None):
            self.stop()
            raise AssertionError("llama-server did not start:\n" + log.read_text(errors="replace")[-3000:])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._out.close()


# (template, the requests' extra fields): R1's prompt opens the block (the reply starts inside
# it); under Qwen 3's the model may open one; Qwen 3 with thinking off closes an empty one
TEMPLATE_CASES = {
    "llama-cpp-deepseek-r1.jinja": [{}],
    "Qwen-Qwen3-0.6B.jinja": [{}, {"chat_template_kwargs": {"enable_thinking": False}}],
}


@pytest.mark.parametrize("template", sorted(TEMPLATE_CASES))
def test_the_reasoning_is_split_as_llama_server_splits_it(template, smollm2, llama_server, tmp_path):
    from infer.runtime import repack

    path = str(TEMPLATES / template)
    common = ["-c", "2048", "-t", "2", "--chat-template-file", path]
    ours = Server(str(smollm2), "-np", "1", *common, "--flash-attn", "off", "--spec-type", "none",
                  "--no-cache", "--no-socket", home=tmp_path / "home")
    peer_repack = [] if repack.verdict().repack else ["-nr"]  # infer's setting on this CPU
    try:
        theirs = LlamaServer(llama_server, "-m", str(smollm2), "-np", "1", *common, "--jinja",
                             "--reasoning-format", "deepseek", "-fa", "off", "--no-webui", *peer_repack,
                             log=tmp_path / "llama-server.log")
        try:
            for extra in TEMPLATE_CASES[template]:
                payload = {"messages": [{"role": "user", "content": "What is 2+2?"}], "temperature": 0,
                           "max_tokens": 48, **extra}
                for stream in (False, True):
                    got = reply_parts(ours.url, payload, stream=stream)
                    assert got == reply_parts(theirs.url, payload, stream=stream), (extra, stream)
                    if not extra and template.startswith("llama-cpp-deepseek"):
                        assert got[0].strip(), "under R1's template the reply starts inside the block"
        finally:
            theirs.stop()
    finally:
        assert ours.stop() == 0
