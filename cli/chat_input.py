"""What the user types into `infer chat`: a line editor on a terminal (prompt_toolkit:
history per model, multi-line input with triple quotes or Alt-Enter), else one message per
piped line (or per triple-quoted block); and, while a reply streams, keys held for the next
prompt (type-ahead)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from infer.cli.chat_output import note


@contextlib.contextmanager
def keys_held() -> Iterator[None]:
    """While a reply streams on a terminal, keys typed are not echoed (an echoed Enter
    scrolls the screen under the reply being redrawn in place, which then leaves copies of
    itself) and not lost: they wait in the terminal's queue, and the next prompt reads them
    (type-ahead, Enter included). Ctrl-C still stops the reply."""
    if not sys.stdin.isatty():
        yield
        return
    import termios

    fd = sys.stdin.fileno()
    try:
        saved = termios.tcgetattr(fd)
    except termios.error:
        yield
        return
    held = list(saved)
    held[3] = saved[3] & ~(termios.ECHO | termios.ICANON)  # (ISIG stays: Ctrl-C is a signal)
    held[6] = list(saved[6])
    held[6][termios.VMIN], held[6][termios.VTIME] = 1, 0
    termios.tcsetattr(fd, termios.TCSANOW, held)  # TCSANOW: what was typed stays queued
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, saved)


def piped_messages() -> Iterator[str]:
    """One message per line, or per block between lines of three double quotes."""
    block: list[str] | None = None
    for raw in sys.stdin:
        line = raw.rstrip("\n")
        if block is not None:
            if line.strip() == '"""':
                yield "\n".join(block)
                block = None
            else:
                block.append(line)
        elif line.strip() == '"""':
            block = []
        elif line.startswith('"""'):
            block = [line[3:]]
        else:
            yield line
    if block:
        yield "\n".join(block)


def terminal_messages(model_name: str) -> Iterator[str]:
    """Lines from a real line editor, with history per model in infer's home folder."""
    import re

    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory
    from prompt_toolkit.key_binding import KeyBindings

    from infer.quant.paths import chat_history_dir

    history_dir = chat_history_dir()
    history_dir.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model_name)[:100]
    keys = KeyBindings()

    @keys.add("escape", "enter")
    def _newline(event: Any) -> None:
        event.current_buffer.insert_text("\n")

    session: Any = PromptSession(history=FileHistory(str(history_dir / f"{safe}.txt")),
                                 key_bindings=keys)
    note("/help for commands, Ctrl-D to leave; \"\"\" or Alt-Enter for several lines")
    while True:
        try:
            text = session.prompt(">>> ")
        except KeyboardInterrupt:
            note("(Ctrl-D or /exit to leave)")
            continue
        except EOFError:
            return
        if text.strip() == '"""' or (text.startswith('"""') and not text.rstrip().endswith('"""', 3)):
            lines = [text.strip()[3:]] if text.strip() != '"""' else []
            while True:
                try:
                    more = session.prompt("... ")
                except (KeyboardInterrupt, EOFError):
                    break
                if more.rstrip().endswith('"""'):
                    lines.append(more.rstrip()[:-3])
                    break
                lines.append(more)
            text = "\n".join(line for line in lines).strip("\n")
        elif text.startswith('"""') and text.rstrip().endswith('"""'):
            text = text.strip()[3:-3]
        yield text
