"""Prompt lookup: ``PromptLookup`` guesses the next tokens from earlier in the same token
history (copies of earlier passages, with the edits the text makes to them, and n-gram
statistics)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from infer.runtime.speculative.proposal import Proposal


def _copy_bucket(m: int) -> int:
    return 8 if m < 12 else 12 if m < 16 else 16 if m < 24 else 24 if m < 32 else 32


def _agree_bucket(top: int, total: int) -> int:
    share = top / total
    return 100 if share == 1.0 else 66 if share >= 2 / 3 else 50 if share >= 0.5 else 25


class _Rule:
    """An edit learned from the text: where the copy read `old`, the text wrote `new`."""

    __slots__ = ("hits", "new", "old")

    def __init__(self, old: list[int], new: list[int]) -> None:
        self.old, self.new = old, new
        self.hits = 0  # how often it came true since it was learned


class _Align:
    """The history's end aligned with an earlier passage: the copy goes on at `at`, or
    inside a rule's new tokens (`rule`, `done` of them written)."""

    __slots__ = ("at", "done", "fresh", "rule")

    def __init__(self, at: int, fresh: _Rule | None = None) -> None:
        self.at = at
        self.rule: _Rule | None = None
        self.done = 0
        self.fresh = fresh  # the edit learned where this copy resumed (else None)


class PromptLookup:
    """The next tokens guessed from earlier in the same token history (prompt and reply).

    Two sources, each guess keyed by what backs it (``Acceptance`` learns how often each
    kind is right):

    - a copy: when the history's end matches an earlier passage for at least COPY_MIN
      tokens, what followed that passage (key ``("copy", m)``, m the match length
      counting the guesses before, bucketed). The copy followed is kept while it matches
      best, so that a repeated phrase does not jump elsewhere; and it survives an edit.
      When the text parts from the copy and meets it again within MAX_EDIT tokens on
      either side (ANCHOR tokens equal), the copy goes on from there, and the edit is
      learned as a rule: where the copy reads the old tokens again (a renamed variable,
      the item that varies in each block of a list), it guesses the new ones instead
      (key ``("edit", hits)``: how often the edit came true). A match through an edit
      counts where the edit came true before or was learned where this copy resumed;
      the guesses of such a copy are keyed ``("edited", m)``, learned apart from plain
      copies (in prose, parting and meeting again is often chance);
    - n-gram statistics: otherwise the most frequent token after the longest of the last
      1 .. ngram_size tokens seen before (ties: the latest), keyed ``("ngram", n,
      agreement, seen)``: the share of the top continuation (100: always the same) and
      how often that n-gram was seen. A field name after ``("`` in a list of twenty
      fields is a bad guess, one after a unique phrase a good one.

    Guesses are made one after another on the history extended by the guesses before.
    """

    COPY_MIN = 8
    MAX_MATCH = 32
    MAX_EDIT = 8  # tokens on either side of an edit that a copy survives
    ANCHOR = 1  # equal tokens after an edit that resume the copy
    RULES = 4  # the latest edits applied
    PART_MIN = 4  # a copy followed for fewer tokens was no copy: its parting teaches nothing

    def __init__(self, ngram_size: int) -> None:
        self.n = ngram_size
        self._reset()

    def _reset(self) -> None:
        self.history: list[int] = []
        # per n: n-gram -> [{next token: count}, the most frequent next token (ties: the latest),
        # its count, all counts], kept as tokens come so that a lookup costs the same however
        # many different tokens followed; and n-gram -> the position after its latest occurrence
        self.after: list[dict[tuple[int, ...], list[Any]]] = [{} for _ in range(self.n + 1)]
        self.latest: list[dict[tuple[int, ...], int]] = [{} for _ in range(self.n + 1)]
        self._align: _Align | None = None  # the copy being followed
        self._parted: tuple[int, int] | None = None  # a copy the text left: (at, where)
        self.rules: list[_Rule] = []  # the latest first

    def sync(self, tokens: Sequence[int]) -> None:
        """Make the history equal `tokens` (usually an extension of it)."""
        h = self.history
        if len(tokens) < len(h) or tokens[:len(h)] != h:
            self._reset()
        self.extend(tokens[len(self.history):])

    def extend(self, tokens: Sequence[int]) -> None:
        h, after, latest, n_max = self.history, self.after, self.latest, self.n
        for token in tokens:
            end = len(h)  # the new token follows the n-grams ending before it
            for n in range(1, min(n_max, end) + 1):
                gram = tuple(h[end - n:end])
                entry = after[n].get(gram)
                if entry is None:
                    after[n][gram] = [{token: 1}, token, 1, 1]
                else:
                    counts = entry[0]
                    c = counts[token] = counts.get(token, 0) + 1
                    entry[3] += 1
                    if c >= entry[2]:
                        entry[1], entry[2] = token, c
                latest[n][gram] = end
            if self._align is not None:
                self._follow(token)
            h.append(token)
            if self._parted is not None:
                self._rejoin()

    def _follow(self, token: int) -> None:
        """The copy meets the history's next token: it goes on, or the text parted from it."""
        a = self._align
        assert a is not None
        expected = self._next((a.at, a.rule, a.done), [])
        if expected is not None and expected[0] == token:
            _, (a.at, a.rule, a.done), ended = expected
            if ended is not None:  # a rule's new tokens all came true
                ended.hits += 1
            return
        if a.at < len(self.history) and self._match(a)[1] >= self.PART_MIN:
            self._parted = (a.at - (len(a.rule.old) if a.rule is not None else 0), len(self.history))
        self._align = None

    def _rejoin(self) -> None:
        """After the text parted from its copy: if the last ANCHOR tokens follow `skip` tokens
        of the copy past where they parted, the copy goes on, and what the text wrote instead
        of those is learned (a rule)."""
        at, where = self._parted  # type: ignore[misc]
        h, k = self.history, self.ANCHOR
        wrote = len(h) - where - k  # tokens the text wrote in place of the copy's
        if wrote > self.MAX_EDIT:
            self._parted = None
            return
        if wrote < 0:
            return
        tail = h[len(h) - k:]
        for skip in range(self.MAX_EDIT + 1):
            if at + skip + k > where:
                break
            if h[at + skip:at + skip + k] == tail:
                rule = None
                if skip:
                    rule = _Rule(h[at:at + skip], h[where:where + wrote])
                    self.rules = [rule, *(r for r in self.rules if r.old != rule.old)][:self.RULES]
                self._align = _Align(at + skip + k, rule)
                self._parted = None
                return

    def _next(self, state: tuple[int, _Rule | None, int],
              guessed: list[int]) -> tuple[int, tuple[int, _Rule | None, int], _Rule | None] | None:
        """The copy's next token from `state` (at, rule, done), the history extended by
        `guessed` (the copy may run into its own continuation: a loop), with the state after
        it and the rule whose new tokens it ends (else None); None where the copy runs out."""
        at, rule, done = state
        h = self.history
        end = len(h)
        if rule is None:
            for r in self.rules:
                if at + len(r.old) <= end and h[at:at + len(r.old)] == r.old:
                    rule, done, at = r, 0, at + len(r.old)
                    break
        if rule is not None and done < len(rule.new):
            token = rule.new[done]
            if done + 1 == len(rule.new):
                return token, (at, None, 0), rule
            return token, (at, rule, done + 1), None
        if at < end:
            token = h[at]
        elif at - end < len(guessed):
            token = guessed[at - end]
        else:
            return None
        return token, (at + 1, None, 0), None

    def _match(self, a: _Align) -> tuple[int, int]:
        """How many of the history's last tokens the copy `a` has followed (at most MAX_MATCH),
        and how many of those without an edit: equal to the tokens before it, or to a rule's
        new tokens where those had the old (a rule that came true before, or the one learned
        where this copy resumed)."""
        h, at = self.history, a.at
        i, m, exact = len(h), 0, None
        if a.rule is not None:  # inside the rule's new tokens: `done` of them written
            i, at, m, exact = i - a.done, at - len(a.rule.old), a.done, 0
        while m < self.MAX_MATCH and at > 0 and i > at:
            if h[at - 1] == h[i - 1]:
                i, at, m = i - 1, at - 1, m + 1
                continue
            for r in self.rules:
                o, n = len(r.old), len(r.new)
                if (r.hits or r is a.fresh) and at >= o and i - n > at - o \
                        and h[i - n:i] == r.new and h[at - o:at] == r.old:
                    if exact is None:
                        exact = m
                    i, at, m = i - n, at - o, m + n
                    break
            else:
                break
        return m, m if exact is None else exact

    def _copy(self) -> tuple[_Align | None, int, bool]:
        """The copy to follow and how far back it matches: the one followed so far, unless
        the latest occurrence of the longest n-gram at the history's end matches longer."""
        h = self.history
        end = len(h)
        source = None
        for n in range(min(self.n, end - 1), 0, -1):
            source = self.latest[n].get(tuple(h[end - n:end]))
            if source is not None:
                break
        a = self._align
        m, exact = self._match(a) if a is not None else (0, 0)
        if source is not None and (a is None or a.at != source or a.rule is not None):
            candidate = _Align(source)
            m_source, exact_source = self._match(candidate)
            if a is None or m_source > m:
                a, m, exact = candidate, m_source, exact_source
        self._align = a if m > 0 else None
        return self._align, m, m != exact

    def _statistics(self, tail: list[int]) -> tuple[int, Hashable] | None:
        """The likeliest token after `tail` by n-gram statistics, and its key."""
        for n in range(min(self.n, len(tail)), 0, -1):
            entry = self.after[n].get(tuple(tail[len(tail) - n:]))
            if entry is not None:
                _, token, top, total = entry
                return token, ("ngram", n, _agree_bucket(top, total), min(total, 3))
        return None

    def propose(self, k_max: int) -> Proposal | None:
        h = self.history
        a, run, edited = self._copy()
        tail = h[max(len(h) - self.n, 0):]
        tokens: list[int] = []
        keys: list[Hashable] = []
        state = (a.at, a.rule, a.done) if a is not None else None
        for j in range(k_max):
            copied = self._next(state, tokens) if state is not None else None
            rule = None
            if copied is not None:
                token, state, ended = copied
                rule = state[1] if state[1] is not None else ended  # whose new tokens it is, if any
            else:
                state = None
            if state is not None and run + j >= self.COPY_MIN:
                if rule is not None:
                    key: Hashable = ("edit", min(rule.hits, 3))
                    edited = True  # the guesses after it are a copy through an edit
                else:
                    key = ("edited" if edited else "copy", _copy_bucket(run + j))
            else:
                found = self._statistics(tail)
                if found is None:
                    break
                if state is not None and found[0] != token:
                    state = None  # the statistics left the copy
                token, key = found
            tokens.append(token)
            keys.append(key)
            tail.append(token)
        return Proposal(tokens, keys) if tokens else None
