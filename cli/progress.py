"""Download progress on stderr: a Rich bar on a terminal, one quiet line per file otherwise."""

from __future__ import annotations

import sys
from typing import Any


class DownloadProgress:
    """A callable for ``infer.quant`` downloads: ``progress(filename, done, total)``."""

    def __init__(self) -> None:
        self._tty = sys.stderr.isatty()
        self._bar: Any = None
        self._tasks: dict[str, Any] = {}
        self._announced: set[str] = set()

    def __call__(self, filename: str, done: int, total: int) -> None:
        if not self._tty:
            if filename not in self._announced:
                self._announced.add(filename)
                size = f" ({total / 1e6:,.1f} MB)" if total else ""
                sys.stderr.write(f"infer: downloading {filename}{size}\n")
                sys.stderr.flush()
            return
        if self._bar is None:
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                 TransferSpeedColumn(), TimeRemainingColumn(), transient=True)
            self._bar.start()
        if filename not in self._tasks:
            self._tasks[filename] = self._bar.add_task(filename, total=total or None)
        self._bar.update(self._tasks[filename], completed=done, total=total or None)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __enter__(self) -> DownloadProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
