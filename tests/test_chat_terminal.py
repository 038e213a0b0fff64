"""`infer chat` on a terminal: the real REPL in a pseudo-terminal, read as a user sees it.

The child runs under pexpect; what it writes goes through a terminal emulator (pyte),
so the assertions are about the screen, not about escape sequences.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import pexpect
import pyte
import pytest
from conftest import CLI

ROWS, COLS = 300, 200


class Terminal:
    """`infer chat ARGS...` in a pseudo-terminal of ROWS x COLS."""

    def __init__(self, *args: object, rows: int = ROWS, cols: int = COLS) -> None:
        self.screen = pyte.HistoryScreen(cols, rows, history=10000)  # (what scrolled off is kept)
        self.stream = pyte.ByteStream(self.screen)
        env = {**os.environ, "TERM": "xterm-256color", "PROMPT_TOOLKIT_NO_CPR": "1"}
        self.child = pexpect.spawn(CLI[0], [*CLI[1:], "chat", *map(str, args)], env=env,
                                   dimensions=(rows, cols))
        self.wait_for(lambda text: self.prompts() == 1, "the first prompt")

    def lines(self) -> list[str]:
        """Every line the terminal has shown: those scrolled off the top, then the screen."""
        cols = self.screen.columns
        scrolled = ["".join(line[x].data for x in range(cols)) for line in self.screen.history.top]
        return [line.rstrip() for line in scrolled + self.screen.display]

    def text(self) -> str:
        return "\n".join(self.lines()).rstrip()

    def prompts(self) -> int:
        return sum(line.startswith(">>>") for line in self.lines())

    def wait_for(self, check: Callable[[str], bool] | str, what: str = "", timeout: float = 60) -> str:
        """Read the child's output until `check` holds for the screen (or the text appears)."""
        test = (lambda text: check in text) if isinstance(check, str) else check
        deadline = time.monotonic() + timeout
        while not test(self.text()):
            if time.monotonic() > deadline:
                raise AssertionError(f"not seen: {what or check!r}\n--- screen ---\n{self.text()}")
            try:
                self.stream.feed(self.child.read_nonblocking(65536, timeout=0.05))
            except pexpect.TIMEOUT:
                pass
            except pexpect.EOF:
                if not test(self.text()):
                    raise AssertionError(f"exited before {what or check!r}\n{self.text()}") from None
        return self.text()

    def type(self, keys: str) -> None:
        self.child.send(keys)

    def enter(self, line: str) -> str:
        """Type a line and press Enter; wait for the next prompt. The screen after it."""
        before = self.prompts()
        self.child.send(line + "\r")
        return self.wait_for(lambda _: self.prompts() > before, f"a prompt after {line!r}")

    def since_last_prompt(self) -> str:
        """What the screen shows between the last two prompts (the last command's output)."""
        lines = self.text().splitlines()
        starts = [i for i, line in enumerate(lines) if line.startswith(">>>")]
        return "\n".join(lines[starts[-2] + 1:starts[-1]])

    def exit_status(self) -> int | None:
        self.child.expect(pexpect.EOF, timeout=30)
        self.child.close()
        return self.child.exitstatus

    def close(self) -> None:
        if self.child.isalive():
            self.child.terminate(force=True)


@pytest.fixture
def terminals():
    opened: list[Terminal] = []

    def open_terminal(*args: object, **size: int) -> Terminal:
        opened.append(Terminal(*args, **size))
        return opened[-1]

    yield open_terminal
    for t in opened:
        t.close()


def saved_messages(home: Path, name: str) -> list[dict[str, str]]:
    return json.loads((home / "sessions" / name / "session.json").read_text())["messages"]


def stats(output: str) -> tuple[int, int]:
    """(cached, prefilled) tokens of the last turn, from /stats."""
    m = re.search(r"\((\d+) cached, (\d+) prefilled\)", output.replace("\n", ""))
    assert m, output
    return int(m.group(1)), int(m.group(2))


def test_a_conversation_with_every_slash_command(terminals, tiny_qwen, tiny_spm, infer_home):
    t = terminals(tiny_qwen, "-n", "6", "--temp", "0", "-s", "You are terse.")
    t.enter("Hello there")
    reply = t.since_last_prompt()
    assert reply.strip(), t.text()
    t.enter("And a second question")
    t.enter("/stats")
    cached, prefilled = stats(t.since_last_prompt())
    assert cached > prefilled > 0  # the first exchange came from the KV cache

    assert "/model MODEL" in t.enter("/help") and "/retry" in t.since_last_prompt()
    t.enter("/set temp 0.5")
    assert "temperature = 0.5" in t.since_last_prompt()
    t.enter("/set top_k lots")
    assert "top_k needs a whole number" in t.since_last_prompt()
    t.enter("/set")
    assert "top_k = 40" in t.since_last_prompt() and "ctx = " in t.since_last_prompt()
    t.enter("/set temp 0")
    t.enter("/tokens")
    assert re.search(r"\d+ of \d+ tokens in context", t.since_last_prompt())
    t.enter("/retry")
    t.enter("/undo")
    assert "removed the last exchange" in t.since_last_prompt()
    t.enter("/save first")
    assert [m["role"] for m in saved_messages(infer_home, "first")] == ["system", "user", "assistant"]
    t.enter("/system Answer in French.")
    t.enter("/show")
    assert "system: Answer in French." in t.since_last_prompt()
    t.enter("/clear")
    assert "new conversation" in t.since_last_prompt()
    t.enter("/save cleared")
    assert saved_messages(infer_home, "cleared") == [{"role": "system", "content": "Answer in French."}]
    t.enter("/load first")
    assert "loaded session 'first'" in t.since_last_prompt()
    t.enter("Hello again")
    t.enter("/stats")
    cached, prefilled = stats(t.since_last_prompt())
    assert cached > 0  # the loaded KV state served the history

    t.enter(f"/model {tiny_spm}")
    assert "now chatting with" in t.since_last_prompt()
    t.enter("/show")
    assert "tiny-spm" in t.since_last_prompt()
    t.enter("One more")
    t.enter("/save switched")
    messages = saved_messages(infer_home, "switched")
    assert [m["content"] for m in messages if m["role"] == "user"] == [
        "Hello there", "Hello again", "One more"]  # the conversation survived the switch
    t.enter("/model no-such-model-anywhere")
    assert "error:" in t.since_last_prompt()
    t.enter("/nope")
    assert "unknown command /nope" in t.since_last_prompt()
    t.type("/bye\r")
    assert t.exit_status() == 0


def test_ctrl_c_stops_a_reply_and_keeps_what_was_said(terminals, tiny_llama, infer_home):
    t = terminals(tiny_llama, "--ctx-size", "8192", "-n", "8000", "--ignore-eos", "--temp", "0", "--plain")
    t.type("Tell me a long story\r")
    t.wait_for(lambda text: len(text.partition("Tell me a long story")[2].strip()) > 20,
               "the reply starting")
    t.type("\x03")
    t.wait_for("(stopped)")
    t.wait_for(lambda _: t.prompts() == 2, "the prompt after the stopped reply")
    t.enter("/save stopped")
    messages = saved_messages(infer_home, "stopped")
    assert messages[-1]["role"] == "assistant" and messages[-1]["content"]
    t.enter("/set max_tokens 3")
    t.enter("Go on")  # the chat goes on after the stop
    t.enter("/save later")
    assert len(saved_messages(infer_home, "later")) == 4


def test_ctrl_c_at_the_prompt_asks_again_and_ctrl_d_leaves(terminals, tiny_qwen):
    t = terminals(tiny_qwen, "-n", "2")
    t.type("half a thought\x03")
    t.wait_for("Ctrl-D or /exit to leave")
    t.wait_for(lambda _: t.prompts() == 2, "a new prompt")
    t.type("\x04")
    assert t.exit_status() == 0


def test_multi_line_input_three_ways(terminals, tiny_qwen, infer_home):
    t = terminals(tiny_qwen, "-n", "2", "--temp", "0")
    t.type('"""\r')
    t.wait_for(lambda text: text.splitlines()[-1].startswith("..."), "the continuation prompt")
    t.type("line one\r")
    t.type("line two\r")
    t.enter('"""')
    t.enter("first\x1b\rsecond")  # Alt-Enter (Esc, Enter) starts a new line in the same message
    t.enter("\x1b[200~pasted\nlines\x1b[201~")  # a bracketed paste of two lines
    t.enter("/save multi")
    users = [m["content"] for m in saved_messages(infer_home, "multi") if m["role"] == "user"]
    assert users == ["line one\nline two", "first\nsecond", "pasted\nlines"]


def test_history_is_kept_across_runs_with_search(terminals, tiny_qwen):
    t = terminals(tiny_qwen, "-n", "2")
    t.enter("the first thing I asked")
    t.enter("something else")
    t.type("\x04")
    t.exit_status()
    again = terminals(tiny_qwen, "-n", "2")
    again.type("\x1b[A")  # Up: the last message of the previous run
    again.wait_for(lambda text: text.splitlines()[-1].startswith(">>> something else"), "Up recalls it")
    again.type("\x03")
    again.wait_for(lambda _: again.prompts() == 2, "a fresh prompt")
    again.type("\x12first")  # Ctrl-R searches the history
    again.wait_for("the first thing I asked", "Ctrl-R finds it")


GRAMMAR = r'root ::= "# Heading\n\nSome **bold** words.\n\n```\ncode line\n```\n"'


def test_replies_are_rendered_as_markdown_unless_plain(terminals, tiny_qwen):
    t = terminals(tiny_qwen, "-n", "40", "--temp", "0", "--grammar", GRAMMAR)
    t.enter("Show me Markdown")
    shown = t.since_last_prompt()
    assert "Some bold words." in shown and "**" not in shown
    assert "Heading" in shown and "# Heading" not in shown
    assert "code line" in shown and "```" not in shown

    plain = terminals(tiny_qwen, "-n", "40", "--temp", "0", "--grammar", GRAMMAR, "--plain")
    plain.enter("Show me Markdown")
    assert plain.since_last_prompt().strip() == "# Heading\n\nSome **bold** words.\n\n```\ncode line\n```"


TYPE_AHEAD_GRAMMAR = (r'root ::= "Start of the reply.\n\n" ("Some more **text** here.\n\n"){40} '
                      r'"End of the reply.\n"')


def test_keys_typed_while_a_reply_streams_wait_for_the_next_prompt(terminals, tiny_spm, infer_home):
    """Typing during a reply, Enter included, neither tears the reply redrawn in place (the
    keys are not echoed into it) nor is lost: the keys are the next message (type-ahead)."""
    t = terminals(tiny_spm, "-n", "4000", "-c", "8192", "--temp", "0", "--grammar", TYPE_AHEAD_GRAMMAR,
                  rows=40, cols=120)
    t.type("Write something long\r")
    t.wait_for(lambda text: text.count("Some more text here.") >= 10, "the reply under way")
    assert "End of the reply." not in t.text()
    t.type("next question\r")
    # (each reply takes ~2 s alone, redrawn in place; a loaded machine once took many times that)
    t.wait_for(lambda _: t.prompts() == 3, "the prompt after the second reply", timeout=300)
    lines = t.lines()
    prompts = [i for i, line in enumerate(lines) if line.startswith(">>>")]
    assert [lines[i] for i in prompts] == [">>> Write something long", ">>> next question", ">>>"], t.text()
    for start, end in itertools.pairwise(prompts):  # each reply: drawn once, nothing typed in it
        reply = "\n".join(lines[start + 1:end])
        assert reply.count("Start of the reply.") == 1 and reply.count("End of the reply.") == 1, t.text()
        assert reply.count("Some more text here.") == 40 and "next question" not in reply, t.text()
    t.enter("/save typed")
    users = [m["content"] for m in saved_messages(infer_home, "typed") if m["role"] == "user"]
    assert users == ["Write something long", "next question"]
