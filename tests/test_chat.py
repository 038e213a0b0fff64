"""`infer chat` with piped input: one message per line, slash commands, replies on stdout."""

from __future__ import annotations

import pytest
from conftest import assert_one_line_error, run_cli
from serve_helpers import Server


def chat(model, script, *flags, env=None):
    return run_cli("chat", model, "-n", "4", "--temp", "0", *flags, input=script, env=env)


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


# -- through a running `infer serve` (--server / INFER_SERVER) ---------------------------------


@pytest.fixture(scope="module")
def chat_server(tiny_qwen, tmp_path_factory):
    server = Server(str(tiny_qwen), "-np", "2", "-c", "4096", home=tmp_path_factory.mktemp("chat-server"))
    yield server
    assert server.stop() == 0, "".join(server.log)


def test_a_chat_through_a_server_says_what_it_says_here(tiny_qwen, chat_server):
    script = "Hello\nHow are you?\n/retry\n/undo\n/system Be brief.\nWho are you?\n"
    here = chat(tiny_qwen, script)
    there = chat(tiny_qwen, script, "--server", chat_server.url)
    assert there.returncode == 0, there.stderr
    assert there.stdout == here.stdout and len(there.stdout.strip().splitlines()) == 4


def test_the_server_reuses_the_conversation_so_far(tiny_qwen, chat_server):
    r = chat(tiny_qwen, "Hello\n/stats\nTell me more\n/stats\n/tokens\n",
             env={"INFER_SERVER": chat_server.url})
    assert r.returncode == 0, r.stderr
    stats = [line for line in r.stdout.splitlines() if line.startswith("context:")]
    cached = [int(s.split("(")[1].split(" cached")[0]) for s in stats]
    prompt = [int(s.split("last turn: ")[1].split(" prompt")[0]) for s in stats]
    assert cached[1] >= prompt[0]  # the second turn's prefix was the first turn, kept in the slot
    assert "tokens in the server's context after the last turn" in r.stdout


def test_what_belongs_to_the_server_is_refused_through_it(tiny_qwen, chat_server, infer_home):
    script = "/set temp 0.5\n/set ctx 512\n/save talk\n/show\n/set\nHi\n"
    r = chat(tiny_qwen, script, "--server", chat_server.url)
    assert r.returncode == 0, r.stderr
    assert "temperature = 0.5" in r.stderr
    assert "ctx belongs where the model is loaded" in r.stderr
    assert "saved session 'talk' (messages and parameters" in r.stderr
    assert f"loaded in the infer server at {chat_server.url}" in r.stdout
    assert "temperature = 0.5" in r.stdout  # /set alone: what this chat sets
    refused = run_cli("chat", tiny_qwen, "-c", "512", "--server", chat_server.url, input="Hi\n")
    assert_one_line_error(refused, 2, "-c/--ctx-size belongs where the model is loaded")


def test_a_session_saved_through_a_server_continues_here_and_back(tiny_qwen, chat_server, infer_home):
    """/save through a server keeps the messages and parameters (the KV cache is the
    server's); the same session continues with the model loaded here, and a session
    saved here (with its KV state) continues through the server."""
    there = chat(tiny_qwen, "/set top_k 7\nHello\n/save remote-talk\n", "--server", chat_server.url)
    assert there.returncode == 0, there.stderr
    here = chat(tiny_qwen, "/set\nGo on\n/save local-talk\n", "--session", "remote-talk")
    assert "loaded session 'remote-talk'" in here.stderr
    assert "reads the whole conversation again" in here.stderr
    assert "top_k = 7" in here.stdout  # the parameter came with the messages
    back = chat(tiny_qwen, "/set\nAnd then?\n/stats\n", "--server", chat_server.url,
                "--session", "local-talk")
    assert back.returncode == 0, back.stderr
    assert "loaded session 'local-talk'" in back.stderr and "top_k = 7" in back.stdout
    prompt = int(back.stdout.split("last turn: ")[1].split(" prompt")[0])
    alone = chat(tiny_qwen, "And then?\n/stats\n", "--server", chat_server.url)
    assert prompt > int(alone.stdout.split("last turn: ")[1].split(" prompt")[0]) + 10  # the history was sent
    missing = chat(tiny_qwen, "Hi\n", "--server", chat_server.url, "--session", "nothing-here")
    assert_one_line_error(missing, 2, "no saved session 'nothing-here'")


def test_an_unreachable_server_ends_the_chat_with_exit_4(tiny_qwen, tmp_path):
    r = chat(tiny_qwen, "Hello\n", "--server", f"unix:{tmp_path / 'nobody.sock'}")
    assert_one_line_error(r, 4, "cannot reach the infer server")


def test_old_exchanges_are_dropped_when_the_server_says_the_chat_no_longer_fits(tiny_qwen, tmp_path):
    server = Server(str(tiny_qwen), "-np", "1", "-c", "256", home=tmp_path)
    try:
        script = "".join(f"Message {i}: {'words ' * 12}\n" for i in range(12))
        r = run_cli("chat", tiny_qwen, "-n", "8", "--temp", "0", "--server", server.url, input=script)
        assert r.returncode == 0, r.stderr
        assert "context full: dropped the 1 oldest exchange(s)" in r.stderr
        assert len(r.stdout.strip().splitlines()) >= 12  # every message was answered
        refused = run_cli("chat", tiny_qwen, "-n", "8", "--temp", "0", "--context-policy", "error",
                          "--server", server.url, input=script)
        assert refused.returncode == 0 and "error:" in refused.stderr
    finally:
        assert server.stop() == 0, "".join(server.log)
