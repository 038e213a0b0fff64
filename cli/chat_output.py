"""What `infer chat` writes besides the replies: answers to slash commands on stdout,
notes (errors, confirmations) as dim lines on stderr."""

from __future__ import annotations

import sys


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def note(text: str) -> None:
    """A dim line on stderr (plain when it is not a terminal)."""
    if sys.stderr.isatty():
        text = f"\033[2m{text}\033[0m"
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
