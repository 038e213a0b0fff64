"""The session's KV cache: prefix reuse computes exactly what a fresh prefill computes."""

from __future__ import annotations

import json

from conftest import run_cli

from infer.runtime.prompt import chat_prompt
from infer.runtime.sampling import SamplingParams
from infer.runtime.session import Completion, Session, common_prefix_len

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


def complete(session, tokens, params=GREEDY) -> Completion:
    return next(e for e in session.generate(tokens, params) if isinstance(e, Completion))


def test_second_turn_prefills_only_new_tokens_and_matches_a_fresh_run(tiny_qwen):
    turn1 = [{"role": "system", "content": "Be brief. " * 20}, {"role": "user", "content": "Hi"}]
    with Session.open(tiny_qwen) as s:
        p1 = chat_prompt(s.model, turn1)
        first = complete(s, p1.tokens)
        assert first.usage.cached_tokens == 0
        turn2 = [*turn1, {"role": "assistant", "content": first.text},
                 {"role": "user", "content": "More"}]
        p2 = chat_prompt(s.model, turn2)
        second = complete(s, p2.tokens)
        # The cache holds the first prompt and the reply (all but its last, undecoded token);
        # the reply re-tokenized inside the second prompt is reused too.
        held = p1.tokens + first.tokens[:-1]
        shared = common_prefix_len(held, p2.tokens)
        assert shared > len(p1.tokens) - 5
        assert second.usage.cached_tokens == shared
        assert second.timings.prefill_tokens == len(p2.tokens) - shared
    with Session.open(tiny_qwen) as fresh:
        assert complete(fresh, p2.tokens).text == second.text


def test_same_prompt_twice_reuses_all_but_the_last_token(tiny_qwen):
    with Session.open(tiny_qwen) as s:
        tokens = chat_prompt(s.model, [{"role": "user", "content": "Hello"}]).tokens
        a = complete(s, tokens)
        b = complete(s, tokens)
        assert b.usage.cached_tokens == len(tokens) - 1
        assert a.text == b.text


def test_generation_stops_when_the_context_is_full(tiny_spm):
    from infer.runtime.params import ContextParams

    with Session.open(tiny_spm, ContextParams(n_ctx=256)) as s:
        tokens = s.model.tokenize("Hello", add_special=True, parse_special=False)
        done = complete(s, tokens, SamplingParams(temperature=0.0, ignore_eos=True))
        assert done.finish_reason == "length"
        assert done.usage.completion_tokens == s.n_ctx - len(tokens)


def test_bench_reports_prefill_and_decode_speed(tiny_spm):
    r = run_cli("bench", tiny_spm, "-p", "32", "-n", "8", "-r", "2", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    tests = {row["test"]: row for row in out["results"]}
    assert set(tests) == {"pp32", "tg8"}
    for row in tests.values():
        assert len(row["samples_tps"]) == 2
        assert row["mean_tps"] > 0


def test_bench_table_on_stdout(smollm2):
    r = run_cli("bench", "smollm2", "-p", "16", "-n", "4", "-r", "1", "-t", "2", env={"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    assert "pp16" in r.stdout and "tg4" in r.stdout and "±" in r.stdout
    # One line names the model with its real size (llama.cpp's description guesses "256M").
    assert r.stdout.splitlines()[0] == "smollm2 (llama, Q4_1) · 135M parameters · 2 threads", r.stdout


def test_ctrl_c_aborts_a_running_prefill_and_the_session_recovers(tiny_qwen):
    import os
    import signal

    import pytest

    from infer.runtime.llama import Batch, C
    from infer.runtime.params import ContextParams

    with Session.open(tiny_qwen, ContextParams(n_ctx=4096, n_batch=4096)) as s:
        tokens = s.model.tokenize("word " * 3000, add_special=True, parse_special=False)
        batch = Batch(len(tokens))
        batch.set_tokens(tokens, start_pos=0)
        with pytest.raises(KeyboardInterrupt), s.context.interruptible():
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C arrives while llama.cpp computes
            s.context.decode(batch)
        batch.close()
        # llama.cpp stopped early instead of finishing the 3,000-token batch.
        assert C.llama_memory_seq_pos_max(C.llama_get_memory(s.context.ptr), 0) < len(tokens) - 1
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        done = complete(s, tokens[:20])
        assert done.usage.completion_tokens == 12


def test_flash_attention_auto_is_on_only_where_a_local_gpu_holds_layers_or_the_v_cache_is_quantized():
    from infer.runtime.llama import flash_attention
    from infer.runtime.params import ContextParams

    # never llama.cpp's own "auto", which turns it on for remote CPU workers too
    assert flash_attention(ContextParams(), local_gpu=False) == "off"
    assert flash_attention(ContextParams(), local_gpu=True) == "on"
    assert flash_attention(ContextParams(flash_attn="on"), local_gpu=False) == "on"
    assert flash_attention(ContextParams(flash_attn="off"), local_gpu=True) == "off"
    assert flash_attention(ContextParams(cache_type_v="q8_0"), local_gpu=False) == "on"
