"""A thinking model's reasoning on the terminal, for `infer run` and `infer chat`.

The reasoning goes to stderr, never stdout (stdout carries the answer alone). On a terminal
it streams dimmed under a "thinking" line and, when the answer begins, folds into one line
("thought for 2.3 s") unless --show-thinking keeps it; --hide-thinking shows nothing.
Elsewhere (a pipe, a file) it is written only with --show-thinking, as it comes.
"""

from __future__ import annotations

import shutil
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, TextIO

_DIM, _RESET = "\x1b[2m", "\x1b[0m"


def thinking_display(flags: Mapping[str, Any], *, out: TextIO | None = None,
                     hidden: bool = False) -> ThinkingDisplay:
    """The display --show-thinking and --hide-thinking ask for, on `out` (default: stderr);
    `hidden`: none at all (--json)."""
    out = out or sys.stderr
    tty = out.isatty()
    shown = not hidden and not flags.get("hide_thinking") and (tty or bool(flags.get("show_thinking")))
    return ThinkingDisplay(out, shown=shown, fold=tty and not flags.get("show_thinking"), dim=tty)


class ThinkingDisplay:
    """Reasoning text as it streams (`write`), ended when the answer begins or the reply ends
    (`end`)."""

    def __init__(self, out: TextIO, *, shown: bool, fold: bool, dim: bool) -> None:
        self.out, self.shown, self.fold, self.dim = out, shown, fold, dim
        self.started: float | None = None  # when the first reasoning came
        self.text = ""  # what was written since the header

    def write(self, text: str) -> None:
        if not self.shown or not text:
            return
        if self.started is None:
            self.started = time.perf_counter()
            text = text.lstrip("\n")
            self._put("thinking…\n" if self.dim else "")
            if not text:
                return
        self.text += text
        self._put(text)

    def end(self) -> None:
        """The reasoning is over: fold it into one line (a terminal), or end its line."""
        if self.started is None:
            return
        seconds = time.perf_counter() - self.started
        rows = self._rows()
        if self.fold and rows + 1 < shutil.get_terminal_size().lines:  # all of it still on screen
            self.out.write(f"\r\x1b[{rows}F\x1b[J")
            self._put(f"thought for {seconds:.1f} s\n")
        elif not self.text.endswith("\n"):
            self._put("\n")
        self.out.flush()
        self.started, self.text = None, ""

    def _rows(self) -> int:
        """How many rows up the header line is from the cursor (characters counted as one
        column each: wide ones may leave a line of the reasoning on screen)."""
        width = max(shutil.get_terminal_size().columns, 1)
        *whole, last = self.text.split("\n")
        return 1 + sum(max(1, -(-len(line) // width)) for line in whole) + len(last) // width

    def _put(self, text: str) -> None:
        self.out.write(f"{_DIM}{text}{_RESET}" if self.dim and text else text)
        self.out.flush()
