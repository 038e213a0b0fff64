"""The prompt cache on disk: a long shared prefix is prefilled once, across processes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
from conftest import CLI, run_cli

from infer.runtime.prompt import chat_prompt
from infer.runtime.prompt_cache import PromptCache
from infer.runtime.session import Session

# About 1,100 tokens with the Qwen 2 vocabulary.
POLICY = "Refunds are issued within thirty days of purchase when the receipt is shown. " * 75
MARKUP = 12  # ChatML around one user turn: <|im_start|>user\n ... <|im_end|>\n<|im_start|>assistant\n


def ask(model, question, *flags, system=POLICY, env=None):
    """`infer run --json` with the policy as system prompt; the parsed result."""
    r = run_cli("run", model, "--json", "-n", "3", "--temp", "0", "-s", system, question, *flags, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def cache_files(home: Path) -> list[Path]:
    return sorted((home / "cache" / "prompts").glob("*/*.kv"))


def test_a_shared_system_prompt_is_prefilled_once(tiny_qwen):
    cold = ask(tiny_qwen, "Can I return shoes?")
    assert cold["usage"]["cached_tokens"] == 0
    warm = ask(tiny_qwen, "What about a gift without a receipt?")
    assert warm["usage"]["cached_tokens"] >= 1000
    assert warm["usage"]["prompt_tokens"] - warm["usage"]["cached_tokens"] <= 30  # the question
    again = ask(tiny_qwen, "What about a gift without a receipt?", "--no-cache")
    assert again["usage"]["cached_tokens"] == 0
    assert again["text"] == warm["text"]


def test_first_token_logits_after_a_restore_match_a_full_prefill(tiny_qwen, tmp_path):
    cache = PromptCache(tmp_path / "cache")
    messages = [{"role": "system", "content": POLICY}, {"role": "user", "content": "Shoes?"}]
    with Session.open(tiny_qwen) as s:
        first = chat_prompt(s.model, messages)
        s.prefill(first.tokens)
        cache.store(s, "tiny")
    second = chat_prompt_for(tiny_qwen, [messages[0], {"role": "user", "content": "And hats?"}])
    with Session.open(tiny_qwen) as fresh:  # as in a new process
        shared = cache.restore(fresh, second)
        assert shared >= 1000
        kept = fresh.prefill(second)
        assert kept == shared
        warm = fresh.context.logits(-1)
        fresh.context.memory_clear()
        fresh.tokens.clear()
        fresh.prefill(second)
        cold = fresh.context.logits(-1)
    assert np.max(np.abs(warm - cold)) <= 1e-3 * np.max(np.abs(cold))


def chat_prompt_for(model_path, messages):
    with Session.open(model_path) as s:
        return chat_prompt(s.model, messages).tokens


def test_another_model_kv_type_or_context_size_never_hits(tiny_qwen, tiny_llama):
    ask(tiny_qwen, "Shoes?")
    assert ask(tiny_qwen, "Hats?", "--cache-type-k", "f32")["usage"]["cached_tokens"] == 0
    assert ask(tiny_qwen, "Hats?", "--ctx-size", "1536")["usage"]["cached_tokens"] == 0
    assert ask(tiny_llama, "Hats?")["usage"]["cached_tokens"] == 0
    assert ask(tiny_qwen, "Hats?")["usage"]["cached_tokens"] >= 1000  # the first one still serves


def test_a_corrupt_or_truncated_entry_is_ignored_and_removed(tiny_qwen, infer_home):
    expected = ask(tiny_qwen, "Shoes?", "--no-cache")["text"]
    ask(tiny_qwen, "Shoes?")
    for damage in ("flip", "truncate"):
        for path in cache_files(infer_home):
            data = bytearray(path.read_bytes())
            if damage == "flip":
                data[-100] ^= 0xFF
            else:
                del data[len(data) // 2:]
            path.write_bytes(bytes(data))
        damaged = set(cache_files(infer_home))
        result = ask(tiny_qwen, "Shoes?")
        assert result["usage"]["cached_tokens"] == 0, damage
        assert result["text"] == expected
        # The damaged files were removed; this run wrote whole ones under the same names.
        assert all(PromptCache(infer_home / "cache" / "prompts").entries()), damaged
        assert ask(tiny_qwen, "Shoes?")["usage"]["cached_tokens"] >= 1000


def test_eviction_keeps_the_cache_under_its_cap(tiny_qwen, infer_home):
    ask(tiny_qwen, "one?")
    one_run = sum(p.stat().st_size for p in cache_files(infer_home))
    cap = int(one_run * 2.5)
    env = {"INFER_PROMPT_CACHE_SIZE": str(cap)}
    for i in range(4):
        ask(tiny_qwen, f"question {i}?", system=f"{i}. {POLICY}", env=env)
        assert sum(p.stat().st_size for p in cache_files(infer_home)) <= cap
    # The newest entries are the ones kept.
    assert ask(tiny_qwen, "again?", system=f"3. {POLICY}", env=env)["usage"]["cached_tokens"] >= 1000


def test_eight_concurrent_runs_share_one_cache(tiny_qwen, infer_home):
    questions = [f"Question number {i}?" for i in range(8)]
    # (one thread each: eight processes spinning two threads each on two cores wait on each other)
    expected = [ask(tiny_qwen, q, "--no-cache", "-t", "1")["text"] for q in questions]
    procs = [subprocess.Popen([*CLI, "run", tiny_qwen, "--json", "-n", "3", "--temp", "0", "-s", POLICY,
                               "-t", "1", q],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for q in questions]
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 8, [err.decode()[-500:] for _, err in results]
    assert [json.loads(out)["text"] for out, _ in results] == expected
    assert all(PromptCache(infer_home / "cache" / "prompts").entries())
    assert ask(tiny_qwen, "One more?")["usage"]["cached_tokens"] >= 1000


def test_cache_list_and_clear(tiny_qwen, tiny_llama, infer_home):
    ask(tiny_qwen, "Shoes?")
    ask(tiny_llama, "Shoes?")
    listed = json.loads(run_cli("cache", "list", "--json").stdout)
    assert {e["model"] for e in listed} == {str(tiny_qwen), str(tiny_llama)}
    assert all(e["tokens"] >= 1000 and e["size"] > 0 for e in listed)
    r = run_cli("cache", "clear", "--model", tiny_llama)
    assert r.returncode == 0, r.stderr
    assert {e["model"] for e in json.loads(run_cli("cache", "list", "--json").stdout)} == {str(tiny_qwen)}
    run_cli("cache", "clear")
    assert json.loads(run_cli("cache", "list", "--json").stdout) == []


def test_continue_prefills_only_each_new_message(tiny_qwen):
    first = run_cli("run", tiny_qwen, "--json", "-n", "5", "--temp", "0", "Tell me about rivers.")
    conversation = json.loads(first.stdout)["conversation"]
    for question in ("And mountains?", "And the sea?"):
        r = run_cli("run", "-C", "--json", "-n", "5", "--temp", "0", question)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["conversation"] == conversation
        prefilled = out["usage"]["prompt_tokens"] - out["usage"]["cached_tokens"]
        assert out["usage"]["cached_tokens"] > 0
        assert prefilled <= len(question) // 2 + MARKUP + 5  # the new message, not the history
    shown = run_cli("run", "-C", "--show-prompt", "Last one")
    for text in ("Tell me about rivers.", "And mountains?", "And the sea?", "Last one"):
        assert text in shown.stdout


def test_continue_with_nothing_to_continue_is_a_usage_error(tiny_qwen):
    from conftest import assert_one_line_error

    assert_one_line_error(run_cli("run", "-C", "Hello"), 2, "no conversation to continue")
    assert_one_line_error(run_cli("run", tiny_qwen, "--conversation", "nope", "Hello"), 2,
                          "not a conversation id")


def test_a_cache_that_cannot_be_written_does_not_fail_the_run(tiny_qwen, infer_home):
    (infer_home / "cache").mkdir(parents=True, exist_ok=True)
    (infer_home / "cache" / "prompts").write_text("not a folder")  # every write fails
    first = ask(tiny_qwen, "Can I return shoes?")
    second = ask(tiny_qwen, "Can I return shoes?")
    assert first["text"] == second["text"] and second["usage"]["cached_tokens"] == 0
    r = run_cli("chat", tiny_qwen, "-n", "3", "--temp", "0", "-s", POLICY, input="Hello\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
