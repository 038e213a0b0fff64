"""Fill-in-the-middle (issue 35): a tiny model whose vocabulary has Qwen 2.5 Coder's FIM
tokens (tests/tiny_model.QWEN_FIM) renders prefix, suffix, extra files and the typed text
in llama-server's order, through `/v1/completions` with `suffix` and llama-server's
`/infill`; llama-server's /infill on the same file renders the same prompt; a model without
FIM tokens is a 400 that says so."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest
from serve_helpers import Server
from test_llama_server import LlamaServer, llama_server  # noqa: F401 (a fixture)
from tiny_model import QWEN_FIM, build_llama_gguf

from infer.runtime.errors import InferError
from infer.runtime.infill import infill_tokens
from infer.runtime.llama import Model

PRE, MID, SUF, REP, SEP = 151659, 151660, 151661, 151663, 151664
BODY = {"input_prefix": "def add(a, b):\n    ", "input_suffix": "\n\nprint(add(1, 2))\n",
        "input_extra": [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}],
        "prompt": "return", "n_predict": 6, "temperature": 0}


@pytest.fixture(scope="module")
def fim_model(models_dir: Path) -> Path:
    return build_llama_gguf(models_dir / "tiny-qwen2-fim.gguf", vocab="qwen2", fim=True)


def test_the_parts_come_in_llama_servers_order(fim_model: Path) -> None:
    assert QWEN_FIM[PRE] == "<|fim_prefix|>"
    with Model(fim_model, vocab_only=True) as model:
        def t(text: str) -> list[int]:
            return model.tokenize(text, add_special=False, parse_special=False)

        got = infill_tokens(model, "def f(", "):\n", extra=[("a.py", "x = 1\n")], prompt="x")
        assert got == [REP, *t("myproject\n"), SEP, *t("a.py\n"), *t("x = 1\n"), SEP, *t("filename\n"),
                       PRE, *t("def f("), *t("x"), SUF, *t("):\n"), MID]
        long = infill_tokens(model, "a " * 3000, "b " * 3000, n_batch=512)
        assert long.count(PRE) == 1 and long.index(SUF) - long.index(PRE) - 1 == 384  # 3/4 of a batch
        assert len(long) - long.index(SUF) - 2 == 512 // 4 - 2  # the suffix's quarter, less two
        assert long[-1] == MID


def test_a_model_without_fim_tokens_cannot_fill_in(tiny_llama: Path) -> None:
    with Model(tiny_llama, vocab_only=True) as model, pytest.raises(InferError, match="fill-in-the-middle"):
        infill_tokens(model, "a", "b")


def test_the_server_fills_in_as_llama_server_renders_it(fim_model: Path, llama_server: Path,  # noqa: F811
                                                       tmp_path: Path) -> None:
    ours = Server(str(fim_model), "-np", "1", "-c", "2048", "--spec-type", "none", "--flash-attn", "off",
                  home=tmp_path / "home")
    # (-b 512: llama-server keeps of the extra files what fits in the context less a batch and
    # twice its server-wide token limit, which with -b 2048 here is two tokens)
    theirs = LlamaServer(llama_server, "-m", str(fim_model), "-np", "1", "-c", "2048", "-b", "512",
                         "-fa", "off", "--no-webui", log=tmp_path / "llama-server.log")
    try:
        with Model(fim_model, vocab_only=True) as model:
            tokens = infill_tokens(model, BODY["input_prefix"], BODY["input_suffix"],
                                   extra=[("util.py", BODY["input_extra"][0]["text"])], prompt=BODY["prompt"])
            rendered = b"".join(model.token_bytes(t, special=True) for t in tokens).decode()
        reference = httpx.post(theirs.url + "/infill", json=BODY, timeout=120).json()
        assert reference["prompt"] == rendered and reference["tokens_evaluated"] == len(tokens)
        whole = httpx.post(ours.url + "/infill", json=BODY, timeout=120).json()
        assert whole["tokens_evaluated"] == len(tokens) and whole["stop"] and whole["tokens_predicted"] == 6
        with httpx.stream("POST", ours.url + "/infill", json={**BODY, "stream": True}, timeout=120) as r:
            events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        parts = [json.loads(e) for e in events]
        assert "".join(p["content"] for p in parts) == whole["content"] and parts[-1]["stop"]
        client = openai.OpenAI(base_url=ours.url + "/v1", api_key="x", max_retries=0)
        done = client.completions.create(model=str(fim_model), prompt=BODY["input_prefix"],
                                         suffix=BODY["input_suffix"],
                                         max_tokens=6, temperature=0)
        with Model(fim_model, vocab_only=True) as model:
            plain = infill_tokens(model, BODY["input_prefix"], BODY["input_suffix"])
        assert done.usage.prompt_tokens == len(plain) and done.usage.completion_tokens == 6
    finally:
        theirs.stop()
        assert ours.stop() == 0, "".join(ours.log)


def test_a_model_without_fim_tokens_is_a_400_that_says_so(tiny_llama: Path, tmp_path: Path) -> None:
    s = Server(str(tiny_llama), "-np", "1", "-c", "1024", "--spec-type", "none", home=tmp_path / "home")
    try:
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "def f(", "suffix": "):", "max_tokens": 4},
                       timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"
        assert "fill-in-the-middle" in r.json()["error"]["message"]
        bad = httpx.post(s.url + "/infill", json={"input_prefix": 3}, timeout=60)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "input_prefix"
        extra = httpx.post(s.url + "/infill", json={"input_prefix": "x", "input_extra": [{"name": 1}]},
                           timeout=60)
        assert extra.status_code == 400 and extra.json()["error"]["param"] == "input_extra"
    finally:
        assert s.stop() == 0, "".join(s.log)
