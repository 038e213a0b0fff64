"""Markers learned from a chat template (runtime/tool_syntax.py), matched against a reply
as it streams: white space in a marker takes any white space, and a marker may hold a call's
number, its id, or a word that says what kind of value follows (issue 33)."""

from __future__ import annotations

import os
import re

from infer.runtime.tool_syntax import ID, INDEX

WORD = "\ue002"  # a marker's word that says a value's kind (DSML's string="true", Kimi's type="number")
_SLOTS = {INDEX: "index", ID: "id", WORD: "word"}
_SLOT_TEXT = {"index": re.compile(r"\d+"), "id": re.compile(r"[A-Za-z0-9_\-]+"), "word": re.compile(r"\w+")}
PARTIAL = -1  # the text ends inside what is being matched
FAIL = -2


class Marker:
    """A learned marker as pieces: literal text, runs of white space (any amount matches),
    a call's number, a call's id."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pieces: list[tuple[str, str]] = []
        for part in re.split(r"(\s+|" + INDEX + "|" + ID + "|" + WORD + ")", text):
            if not part:
                continue
            kind = "ws" if part.isspace() else _SLOTS.get(part, "lit")
            self.pieces.append((kind, part))

    def __bool__(self) -> bool:
        return any(kind != "ws" for kind, _ in self.pieces)

    def match(self, text: str, pos: int, found: dict[str, str] | None = None) -> int:
        """Where a match at `pos` ends, or PARTIAL or FAIL; a number or id seen goes into `found`.
        Blank space before a marker is passed over (a model may write a space where its template
        writes none: after a JSON object, before a closing tag)."""
        if self.pieces and self.pieces[0][0] != "ws":
            while pos < len(text) and text[pos] in " \t":
                pos += 1
        for kind, part in self.pieces:
            if kind == "ws":
                while pos < len(text) and text[pos].isspace():
                    pos += 1
                continue
            if kind == "lit":
                if text.startswith(part, pos):
                    pos += len(part)
                    continue
                return PARTIAL if part.startswith(text[pos:]) else FAIL
            m = _SLOT_TEXT[kind].match(text, pos)
            if m is None or m.end() == len(text):
                return PARTIAL if pos == len(text) or m is not None else FAIL
            if found is not None:
                found[kind] = m.group()
            pos = m.end()
        return pos

    def search(self, text: str, pos: int) -> tuple[int, int]:
        """The first match at or after `pos`: (start, end); (start, PARTIAL) where the text
        may end inside one from `start`; (-1, FAIL) where there is none."""
        first = next((part for kind, part in self.pieces if kind == "lit"), "")
        at = pos
        while True:
            at = text.find(first[:1], at) if first else at
            if at < 0:
                return -1, FAIL
            end = self.match(text, at)
            if end != FAIL:
                return at, end
            at += 1


def worded(string: str, other: str) -> tuple[str, Marker | None]:
    """Where the markers after a string's key and another's differ by one word ("true" and
    "false", "string" and "number"): that word for strings, and a marker taking any word."""
    head = len(os.path.commonprefix([string, other]))  # noqa: RUF071 (text, not paths)
    tail = len(os.path.commonprefix([string[head:][::-1], other[head:][::-1]]))  # noqa: RUF071
    while head and (string[head - 1].isalnum() or string[head - 1] == "_"):
        head -= 1  # (whole words: "true" and "false" share the "e")
    while tail and (string[len(string) - tail].isalnum() or string[len(string) - tail] == "_"):
        tail -= 1
    word, other_word = string[head:len(string) - tail], other[head:len(other) - tail]
    if string == other or not re.fullmatch(r"\w+", word) or not re.fullmatch(r"\w+", other_word):
        return "", None
    return word, Marker(string[:head] + WORD + string[len(string) - tail:])
