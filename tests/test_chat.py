"""`infer chat` with piped input: one message per line, slash commands, replies on stdout."""

from __future__ import annotations

import pytest
from conftest import run_cli


def chat(model, script, *flags):
    return run_cli("chat", model, "-n", "4", "--temp", "0", *flags, input=script)


def test_piped_messages_get_one_reply_each(tiny_qwen):
    r = chat(tiny_qwen, "Hello\nHow are you?\n")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.strip().splitlines()) == 2


def test_retry_repeats_a_greedy_reply_and_undo_forgets(tiny_qwen):
    r = chat(tiny_qwen, "Hello\n/retry\n/undo\n/tokens\n")
    lines = r.stdout.strip().splitlines()
    assert lines[0] == lines[1]  # greedy: the retried reply is the same
    assert "removed the last exchange" in r.stderr
    system_only = chat(tiny_qwen, "/tokens\n").stdout.strip()
    assert lines[2] == system_only  # after /undo the context is back to the empty conversation


def test_triple_quoted_block_is_one_message(tiny_qwen):
    r = chat(tiny_qwen, '"""\nline one\nline two\n"""\n/stats\n')
    assert r.returncode == 0, r.stderr
    assert "1 generated" not in r.stdout and "prompt tokens" in r.stdout


def test_set_system_clear_and_unknown_commands_keep_the_chat_going(tiny_qwen):
    r = chat(tiny_qwen, "/set temp 0.5\n/set top_k nope\n/system Be brief.\n/show\n/clear\n/nope\nHi\n")
    assert r.returncode == 0, r.stderr
    assert "temperature = 0.5" in r.stderr
    assert "top_k needs a whole number" in r.stderr
    assert "system: Be brief." in r.stdout
    assert "unknown command /nope" in r.stderr
    assert r.stdout.strip().splitlines()[-1]  # the reply to "Hi"


def test_set_alone_lists_parameters(tiny_qwen):
    r = chat(tiny_qwen, "/set\n")
    assert "temperature = 0.0" in r.stdout and "top_k = " in r.stdout


def test_exit_stops_reading(tiny_qwen):
    r = chat(tiny_qwen, "/exit\nHello\n")
    assert r.returncode == 0 and r.stdout == ""


def test_context_policy_error_refuses_the_turn_with_a_message(tiny_qwen):
    r = run_cli("chat", tiny_qwen, "-c", "256", "-n", "8", "--temp", "0", "--context-policy", "error",
                input="".join(f"Message {i}: {'words ' * 12}\n" for i in range(12)))
    assert r.returncode == 0, r.stderr
    assert "do not fit the context" in r.stderr


def test_save_and_load_continue_with_the_cache(tiny_qwen, infer_home):
    saved = chat(tiny_qwen, "Hello\nTell me more\n/save talk\n")
    assert "saved session 'talk'" in saved.stderr
    resumed = chat(tiny_qwen, "Go on\n/stats\n", "--session", "talk")
    assert "loaded session 'talk'" in resumed.stderr and "again" not in resumed.stderr
    stats = resumed.stdout.strip().splitlines()[-1]
    cached = int(stats.split("(")[1].split(" cached")[0])
    assert cached > 20  # the history came from the saved KV state, not a new prefill


def test_a_session_from_other_settings_is_read_again(tiny_qwen, infer_home):
    chat(tiny_qwen, "Hello\n/save other\n")
    r = chat(tiny_qwen, "Go on\n/stats\n", "--session", "other", "-c", "1024")
    assert "reads the whole conversation again" in r.stderr
    assert "(0 cached" in r.stdout


def test_loading_a_missing_session_is_one_line(tiny_qwen):
    r = chat(tiny_qwen, "/load nothing-here\nHi\n")
    assert r.returncode == 0
    assert "no saved session 'nothing-here'" in r.stderr


def test_set_ctx_reopens_the_context_and_keeps_the_conversation(tiny_qwen):
    r = chat(tiny_qwen, "Hello\n/set ctx 1024\n/tokens\n/set ctx lots\n")
    assert r.returncode == 0, r.stderr
    assert "ctx = 1024" in r.stderr
    used = int(r.stdout.strip().splitlines()[-1].split()[0])
    assert r.stdout.strip().splitlines()[-1].endswith("of 1024 tokens in context" + f" ({used / 1024:.0%})")
    assert used > 10  # the first exchange is still there
    assert "ctx needs a whole number" in r.stderr


LONG_SYSTEM = "You answer questions about rivers. " * 60  # over the prompt cache's 256 tokens


def _first_turn(stats: str) -> tuple[int, int]:
    """(prompt tokens, cached tokens) from /stats."""
    import re

    m = re.search(r"last turn: (\d+) prompt tokens \((\d+) cached", stats)
    assert m, stats
    return int(m.group(1)), int(m.group(2))


@pytest.fixture(scope="module")
def tiny_mistral(models_dir):
    """Mistral Nemo's real template: it writes the system prompt inside the last user turn."""
    from tiny_model import build_llama_gguf, fixtures_dir

    template = (fixtures_dir() / "chat-templates" / "mistralai-Mistral-Nemo-Instruct-2407.jinja").read_text()
    return build_llama_gguf(models_dir / "tiny-mistral.gguf", vocab="llama-spm", chat_template=template)


@pytest.mark.parametrize("model", ["tiny_qwen", "tiny_mistral"])
def test_a_long_system_prompt_is_prefilled_once_across_chats(model, request, infer_home):
    path = request.getfixturevalue(model)
    first = chat(path, "Hello\n/stats\n", "-s", LONG_SYSTEM)
    assert first.returncode == 0, first.stderr
    prompt, cached = _first_turn(first.stdout)
    assert prompt > 300 and cached == 0
    assert list((infer_home / "cache" / "prompts").rglob("*.kv"))  # the system prompt's state
    # Another chat with the same system prompt and another question: only the rest is prefilled.
    second = chat(path, "What is a delta?\n/stats\n", "-s", LONG_SYSTEM)
    assert second.returncode == 0, second.stderr
    prompt2, cached2 = _first_turn(second.stdout)
    assert 256 <= cached2 < prompt2 and prompt2 - cached2 < 30
    # The reply is what a chat without the cache gives.
    plain = chat(path, "What is a delta?\n", "-s", LONG_SYSTEM, "--no-cache")
    assert second.stdout.splitlines()[0] == plain.stdout.splitlines()[0]
