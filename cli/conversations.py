"""What `infer run` said, so that `infer run --continue` can go on from there.

Each run with a chat template records its messages as
``INFER_HOME/conversations/ID.json``; ``last`` names the newest. Only the most
recent KEEP records are kept. The KV state that makes a continued turn cheap is
not here: it is in the prompt cache, found by the conversation's tokens.
"""

from __future__ import annotations

import json
import os
import re
import time

from infer.quant.paths import conversations_dir
from infer.runtime.atomic import write_atomic
from infer.runtime.errors import UsageError

TYPE_CHECKING = False  # (typing costs the start-up of every call: cli/main.py)
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

KEEP = 200
SLACK = 20
_ID = re.compile(r"[0-9a-f]{12}")


class Record:
    """One conversation: its id, the model and the messages so far."""

    __slots__ = ("id", "messages", "model")

    def __init__(self, id: str, model: str, messages: list[dict[str, Any]] | None = None) -> None:
        self.id = id
        self.model = model
        self.messages = [] if messages is None else messages

    @classmethod
    def new(cls, model: str) -> Record:
        return cls(os.urandom(6).hex(), model)


def load(conversation_id: str | None) -> Record:
    """The conversation `conversation_id`, or the last one; UsageError if there is none."""
    if conversation_id is None:
        try:
            conversation_id = (conversations_dir() / "last").read_text(encoding="utf-8").strip()
        except OSError:
            raise UsageError("there is no conversation to continue yet") from None
    if not _ID.fullmatch(conversation_id):
        raise UsageError(f"{conversation_id!r} is not a conversation id (12 hex digits, shown by -v)")
    try:
        data = json.loads((conversations_dir() / f"{conversation_id}.json").read_text(encoding="utf-8"))
        return Record(conversation_id, str(data["model"]), list(data["messages"]))
    except (OSError, ValueError, KeyError, TypeError):
        raise UsageError(f"no conversation {conversation_id}") from None


def save(record: Record) -> None:
    """Write the record and make it the last one (atomically); forget the oldest beyond KEEP."""
    data = {"id": record.id, "model": record.model, "messages": record.messages, "updated": time.time()}
    where = conversations_dir()
    write_atomic(where / f"{record.id}.json", json.dumps(data, ensure_ascii=False).encode())
    write_atomic(where / "last", record.id.encode())
    names = [name for name in os.listdir(where) if name.endswith(".json")]
    if len(names) > KEEP:  # down to KEEP - SLACK: the pass that reads every record's time is rare
        records = sorted((where / name for name in names), key=_mtime, reverse=True)
        for old in records[KEEP - SLACK:]:
            old.unlink(missing_ok=True)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # removed by another process meanwhile
        return 0.0
