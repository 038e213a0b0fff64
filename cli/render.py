"""How a chat reply reaches the terminal: plain text as it streams, or rendered Markdown.

Markdown is rendered block by block: a finished block (a paragraph, a list, a
closed code fence) is printed once, rendered, above the block still being
written, which rich's Live redraws in place. The live part is kept shorter than
the screen (a long code fence is cut and reopened), so nothing is redrawn off screen.
"""

from __future__ import annotations

import math
import re
import sys
import time
from collections.abc import Iterator
from typing import Any, Protocol, TextIO

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
# Redraw the live block at most this often (seconds).
_REDRAW_INTERVAL = 0.05


class ReplyWriter(Protocol):
    def write(self, text: str) -> None: ...

    def close(self) -> None: ...


class PlainReply:
    """The reply as it comes, ending on a new line."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.last = "\n"

    def write(self, text: str) -> None:
        if text:
            self.out.write(text)
            self.out.flush()
            self.last = text[-1]

    def close(self) -> None:
        if self.last != "\n":
            self.out.write("\n")
            self.out.flush()
        self.last = "\n"


class MarkdownReply:
    """The reply rendered as Markdown while it streams (rich)."""

    def __init__(self, console: Any = None) -> None:
        from rich.console import Console
        from rich.live import Live

        self.console = console or Console(highlight=False)
        self.live = Live(console=self.console, auto_refresh=False, vertical_overflow="ellipsis")
        self.pending = ""  # Markdown source of the block being written
        self.blocks = 0  # blocks printed so far
        self.continued = False  # the block being written goes on from a cut code fence
        self.drawn_at = 0.0
        self.live.start()

    def write(self, text: str) -> None:
        self.pending += text
        while (cut := _block_end(self.pending)) is not None:
            self._print(self.pending[:cut])
            self.pending = self.pending[cut:]
        self._cut_if_tall()
        now = time.monotonic()
        if now - self.drawn_at >= _REDRAW_INTERVAL:
            self._redraw()
            self.drawn_at = now

    def close(self) -> None:
        self._redraw()
        self.live.stop()

    def _print(self, source: str, *, cut: bool = False) -> None:
        if not source.strip():
            return
        self.live.console.print(self._renderable(source))
        self.blocks += 1
        self.continued = cut
        self.drawn_at = 0.0  # redraw the live part at once

    def _redraw(self) -> None:
        from rich.text import Text

        self.live.update(self._renderable(self.pending) if self.pending.strip() else Text(""),
                         refresh=True)

    def _renderable(self, source: str) -> Any:
        from rich.console import Group
        from rich.markdown import Markdown
        from rich.text import Text

        markdown = _Trimmed(Markdown(source.strip("\n")))
        return Group(Text(""), markdown) if self.blocks and not self.continued else markdown

    def _cut_if_tall(self) -> None:
        """Print the finished lines of a block that would no longer fit on the screen."""
        complete = self.pending[: self.pending.rfind("\n") + 1]
        width = max(self.console.width, 20)
        rows = sum(max(1, math.ceil(len(line) / width)) for line in complete.split("\n"))
        if rows < max(self.console.height - 4, 4):
            return
        fence = _open_fence(complete)
        if fence is None:
            self._print(complete)
            self.pending = self.pending[len(complete):]
        else:  # close the fence for the part printed, open it again for the rest
            opening, marker = fence
            self._print(complete + marker + "\n", cut=True)
            self.pending = opening + self.pending[len(complete):]


class _Trimmed:
    """A renderable without the blank lines rich puts before some blocks (lists)."""

    def __init__(self, renderable: Any) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Any, options: Any) -> Iterator[Any]:
        from rich.segment import Segment

        lines = console.render_lines(self.renderable, options, pad=False)
        while lines and all(not seg.text.strip() and not (seg.style and seg.style.bgcolor)
                            for seg in lines[0]):
            lines.pop(0)
        for line in lines:
            yield from line
            yield Segment.line()


def _block_end(source: str) -> int | None:
    """Where the first finished block of `source` ends, or None while it is still open.

    A block ends at a blank line outside a code fence, or with the line that closes a fence.
    """
    pos, fence, seen_text = 0, None, False
    while (nl := source.find("\n", pos)) != -1:
        line = source[pos:nl]
        pos = nl + 1
        m = _FENCE.match(line)
        if fence is not None:
            if _closes(m, fence):
                return pos
        elif m:
            fence, seen_text = m.group(1), True
        elif not line.strip():
            if seen_text:
                return pos
        else:
            seen_text = True
    return None


def _closes(m: re.Match[str] | None, fence: str) -> bool:
    """Whether a fence line `m` closes a fence opened with `fence` (same character, as long, bare)."""
    return bool(m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not m.group(2).strip())


def _open_fence(source: str) -> tuple[str, str] | None:
    """(the opening line, the closing marker) of a code fence `source` leaves open, if any."""
    opening: tuple[str, str] | None = None
    for line in source.split("\n"):
        m = _FENCE.match(line)
        if opening is None:
            if m:
                opening = (line + "\n", m.group(1))
        elif _closes(m, opening[1]):
            opening = None
    return opening


def reply_writer(plain: bool) -> ReplyWriter:
    """Markdown on a terminal unless `plain`; the text as it comes otherwise."""
    if plain or not sys.stdout.isatty():
        return PlainReply()
    return MarkdownReply()


def print_table(table: Any) -> None:
    """Print a Rich table on stdout: fitted to a terminal's width, and never cut or
    wrapped when stdout is a pipe or a file (Rich would assume 80 columns there)."""
    from rich.console import Console

    width = None if sys.stdout.isatty() else 100_000  # the table keeps its natural width
    Console(soft_wrap=True, highlight=False, width=width).print(table)
