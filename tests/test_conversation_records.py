"""The records `infer run --continue` goes on from (cli/conversations.py)."""

from __future__ import annotations

import os

import pytest

from infer.cli import conversations
from infer.quant.paths import conversations_dir
from infer.runtime.errors import UsageError


def test_a_saved_record_loads_back_and_is_the_last(infer_home):
    record = conversations.Record.new("smollm2")
    record.messages.append({"role": "user", "content": "Hello"})
    conversations.save(record)
    for loaded in (conversations.load(record.id), conversations.load(None)):
        assert (loaded.id, loaded.model, loaded.messages) == (record.id, "smollm2", record.messages)


def test_only_the_newest_records_are_kept(infer_home, monkeypatch):
    monkeypatch.setattr(conversations, "KEEP", 5)
    monkeypatch.setattr(conversations, "SLACK", 2)
    ids = []
    for i in range(8):
        record = conversations.Record.new("m")
        conversations.save(record)
        path = conversations_dir() / f"{record.id}.json"
        os.utime(path, (1_000_000 + i, 1_000_000 + i))  # (the order, whatever the clock's resolution)
        ids.append(record.id)
    kept = sorted(p.stem for p in conversations_dir().glob("*.json"))
    # The sixth save found 6 > KEEP and kept the newest KEEP - SLACK; the next two were added.
    assert kept == sorted(ids[3:]), "the oldest records go, never the newer ones"
    assert len(kept) <= 5
    assert conversations.load(None).id == ids[-1]
    with pytest.raises(UsageError, match="no conversation"):
        conversations.load(ids[0])
