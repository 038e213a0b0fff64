"""How piped standard input and the PROMPT argument combine into one prompt.

- stdin is a terminal: the PROMPT argument is the prompt.
- stdin is piped: its text comes first, then a blank line, then PROMPT.
- PROMPT ``-``: standard input alone.
Binary or non-UTF-8 input is a usage error.
"""

from __future__ import annotations

from infer.runtime.errors import UsageError

TYPE_CHECKING = False  # (typing and collections.abc cost the start-up of every call: cli/main.py)
if TYPE_CHECKING:
    from typing import BinaryIO


def decode_stdin(data: bytes) -> str:
    """Piped bytes as text; binary data or invalid UTF-8 is a UsageError."""
    if b"\x00" in data:
        raise UsageError("standard input looks binary (it contains NUL bytes); infer reads UTF-8 text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(
            f"standard input is not valid UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})"
        ) from None
    return text.removeprefix("\ufeff")


def combine_prompt(argument: str | None, stdin: BinaryIO, stdin_is_tty: bool) -> str:
    """The prompt from the PROMPT argument and standard input, by the rules above."""
    piped = "" if stdin_is_tty else decode_stdin(stdin.read())
    if argument == "-":
        if stdin_is_tty:
            raise UsageError("PROMPT '-' reads standard input, but standard input is a terminal")
        if not piped.strip():
            raise UsageError("PROMPT '-' reads standard input, but it was empty")
        return piped
    if not piped.strip():
        if argument is None:
            raise UsageError("no prompt: give PROMPT, or pipe text into standard input")
        return argument
    if argument is None:
        return piped
    return f"{piped.rstrip()}\n\n{argument}"
