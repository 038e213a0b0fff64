"""Speculative decoding: propose several tokens cheaply, verify them in one step.

A proposer guesses the next tokens: ``PromptLookup`` finds the text's end earlier in
the prompt or the reply and takes what followed it there (free), and learns the edits
the text makes to what it copies (a renamed variable); ``DraftModel`` runs a small
model of the same vocabulary. The main model then decodes the pending token
and the k guesses in one batch, and the request's own sampler chain samples position
by position, accepting while the sample equals the guess (``verify``). With a
deterministic proposer that draws what decoding without speculation draws, one sample
per emitted token, up to the rounding of the batch shapes (on a CPU llama.cpp computes
a token decoded in a batch slightly differently from one decoded alone).

A verification batch is not free (on a 2-core CPU a batch of 2 tokens costs about two
single steps, one of 5 about three), so the draft length is chosen per step from the
cost of a batch of n tokens on this model and device (``CostModel``, from a profile
measured once: ``Speculator``) and from how often guesses backed by the same kind of
evidence were right (``Acceptance``). When no length is expected to pay, nothing is
proposed and the step is a plain decode.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from infer.runtime.errors import UsageError

if TYPE_CHECKING:
    from infer.runtime.llama import Context, Model, SamplerChain
    from infer.runtime.session import Session

SPEC_TYPES = ("auto", "none", "ngram", "draft")


@dataclass(frozen=True)
class SpecParams:
    """How to speculate; names follow llama.cpp's ``--spec-*`` flags.

    ``type``: ``auto`` is prompt lookup, cost-aware (it proposes only when the
    measured cost and acceptance say it pays; a draft model makes it ``draft``);
    ``none`` turns speculation off. ``n_min == n_max`` is a fixed draft length
    (proposed whenever the proposer has that many tokens), for comparisons.
    """

    type: str = "auto"
    n_max: int = 16
    n_min: int = 0
    p_min: float = 0.75  # a draft model's guess must be at least this likely (its own softmax)
    ngram_size: int = 4  # the longest n-gram looked up (down to 1)

    def __post_init__(self) -> None:
        if self.type not in SPEC_TYPES:
            raise UsageError(f"--spec-type must be one of {', '.join(SPEC_TYPES)}, got {self.type!r}")
        if not 1 <= self.n_max <= 64:
            raise UsageError(f"--spec-draft-n-max must be in [1, 64], got {self.n_max}")
        if not 0 <= self.n_min <= self.n_max:
            raise UsageError(f"--spec-draft-n-min must be in [0, --spec-draft-n-max], got {self.n_min}")
        if not 0 <= self.p_min <= 1 or math.isnan(self.p_min):
            raise UsageError(f"--draft-p-min must be in [0, 1], got {self.p_min}")
        if not 1 <= self.ngram_size <= 16:
            raise UsageError(f"--spec-ngram-size must be in [1, 16], got {self.ngram_size}")

    @property
    def fixed(self) -> bool:
        return self.n_min == self.n_max

    @property
    def enabled(self) -> bool:
        return self.type != "none"


# -- what a batch costs ------------------------------------------------------------------


class CostModel:
    """Seconds one decode of a batch of n tokens takes, for n = 1 .. max_n, as measured.

    Each size keeps a moving average of its own timings. Batches of two or more tokens
    are then fitted with a line robust to outliers (Siegel's repeated median of the
    slopes between measured sizes, then the median intercept): a shared machine's hiccup at one size
    does not rule that size out for the rest of the run, and sizes never measured are
    read off the line. Until two sizes are measured, an extra token is assumed to cost
    half a single-token step. A Speculator fills it from its measured profile; the
    scheduler (``infer batch``) with the timings of its own steps, and compares sizes with
    `ratio` (it never decodes a single token).
    """

    PRIOR_SLOPE = 0.5
    WEIGHT = 0.2  # of a new timing in the moving average

    def __init__(self, max_n: int) -> None:
        self.max_n = max_n
        self.seconds: dict[int, float] = {}
        self._line: tuple[float, float] | None = None  # (seconds at n = 2, seconds per extra token)

    def observe(self, n: int, seconds: float) -> None:
        if not 1 <= n <= self.max_n or seconds <= 0:
            return
        old = self.seconds.get(n)
        if old is not None:  # one stall of a shared machine moves the average a little only
            seconds = min(seconds, 2 * old)
        self.seconds[n] = seconds if old is None else old + self.WEIGHT * (seconds - old)
        self._line = None

    def _fit(self) -> tuple[float, float] | None:
        if self._line is None:
            points = sorted((n, t) for n, t in self.seconds.items() if n >= 2)
            one = self.seconds.get(1)
            if not points:
                if one is None:
                    return None
                self._line = (one * (1 + self.PRIOR_SLOPE), one * self.PRIOR_SLOPE)
            elif len(points) == 1:
                n, t = points[0]
                if one is None:  # the single step this size would be under the prior
                    one = t / (1 + self.PRIOR_SLOPE * (n - 1))
                slope = one * self.PRIOR_SLOPE
                self._line = (t - slope * (n - 2), slope)
            else:
                import statistics  # not at start-up: fractions and decimal cost ~7 ms of every run

                slope = max(statistics.median(  # Siegel's repeated median
                    statistics.median((t2 - t1) / (n2 - n1) for n2, t2 in points if n2 != n1)
                    for n1, t1 in points), 0.0)
                at2 = statistics.median(t - slope * (n - 2) for n, t in points)
                self._line = (at2, slope)
        return self._line

    def seconds_at(self, n: int) -> float | None:
        """The estimated seconds of a batch of n tokens; None before anything was measured."""
        line = self._fit()
        if line is None:
            return None
        at2, slope = line
        if n <= 1:
            one = self.seconds.get(1)
            return one if one is not None else max(at2 - slope, 1e-9)
        return max(at2 + slope * (n - 2), 1e-9)

    def ratio(self, n: int, m: int) -> float:
        """The cost of a batch of m tokens relative to one of n (at least 1 when m >= n)."""
        a, b = self.seconds_at(n), self.seconds_at(m)
        if a is None or b is None:
            a, b = 1 + self.PRIOR_SLOPE * (max(n, 1) - 1), 1 + self.PRIOR_SLOPE * (max(m, 1) - 1)
        return max(b / a, 1.0) if m >= n else b / a

    def cost(self, n: int) -> float:
        """The cost of a batch of n tokens relative to a single-token step."""
        return 1.0 if n <= 1 else self.ratio(1, n)


# -- how often proposals are right -------------------------------------------------------


class Acceptance:
    """How often a guess is right, by what backed it (its key), learned as the text goes.

    Prompt lookup gives each guess a key (see ``PromptLookup``): a copy of an earlier
    passage that has matched for m tokens, or the statistics of what followed the last n
    tokens before. Every guess is scored against the tokens that come, whether or not
    it was verified (``Speculator`` keeps each step's whole proposal until the text
    has passed it), up to and including its first wrong one, so a kind of guess that
    the costs rule out is still measured. A key starts from a prior worth a few
    observations, never more than the acceptance of all guesses so far, so that a text
    that does not repeat its input stops speculation under every key at once.
    """

    PRIOR_WEIGHT = 3.0
    OVERALL_PRIOR = (0.9, 4.0)  # (rate, weight) before anything was tested: worth trying
    # Each step, the overall counts fade by this much: the overall rate follows the
    # stretch of text being written (half in ~35 steps), and a text that starts
    # repeating itself later is trusted again.
    FADE = 0.98

    def __init__(self) -> None:
        self.tested: dict[Hashable, float] = {}
        self.accepted: dict[Hashable, float] = {}
        self._all = [0.0, 0.0]  # accepted, tested

    def overall(self) -> float:
        rate, weight = self.OVERALL_PRIOR
        return (self._all[0] + rate * weight) / (self._all[1] + weight)

    def rate(self, key: Hashable) -> float:
        prior = min(_prior(key), self.overall())
        return ((self.accepted.get(key, 0.0) + prior * self.PRIOR_WEIGHT)
                / (self.tested.get(key, 0.0) + self.PRIOR_WEIGHT))

    def record(self, key: Hashable, right: bool) -> None:
        """One guess under `key` was scored (its guesses before it were right)."""
        self.tested[key] = self.tested.get(key, 0.0) + 1
        self._all[1] += 1
        if right:
            self.accepted[key] = self.accepted.get(key, 0.0) + 1
            self._all[0] += 1

    def observe(self, keys: Sequence[Hashable], accepted: int) -> None:
        """The guesses under `keys` were scored in order and the first `accepted` were right."""
        for i, key in enumerate(keys[:accepted + 1]):
            self.record(key, i < accepted)

    def fade(self) -> None:
        """A step was taken."""
        self._all[0] *= self.FADE
        self._all[1] *= self.FADE


def _prior(key: Hashable) -> float:
    """What a guess under `key` is expected to be worth before any was tested: optimistic
    enough for a likely kind to be tried (and then measured), not so much that a text
    without repeats pays for many tries."""
    if isinstance(key, tuple) and key and key[0] in ("copy", "edited"):
        return 1.0 - 1.0 / key[1]  # a long copy goes on: 0.875 at 8 tokens, 0.97 at 32
    if isinstance(key, tuple) and key and key[0] == "edit":
        return (0.6, 0.75, 0.85, 0.9)[key[1]]  # an edit that came true before is likely again
    if isinstance(key, tuple) and key and key[0] == "ngram":
        _, n, agree, seen = key
        sure = min(0.3 + 0.1 * n + 0.125 * (seen - 1), 0.95)  # a 4-gram: 0.7 seen once, 0.95 thrice
        return sure * agree / 100
    return 0.8


MARGIN = 0.05  # a step with guesses must be expected to pay this much more than one without


def best_length(rates: Sequence[float], costs: Sequence[float], n_min: int, share: float = 1.0) -> int:
    """The draft length k that maximizes expected tokens per unit of cost, 0 if none beats a
    plain step. rates[i]: the chance that guess i is right given the ones before it were;
    costs[k]: the cost of the step with k guesses relative to the step without (verifying
    them and proposing them). `share`: what one more token is worth against the step's
    output without guesses (1 for one sequence; 1/16 in a batch of 16 sequences)."""
    best_k, best_gain = 0, 1.0
    expected, alive = 1.0, 1.0
    for k in range(1, len(rates) + 1):
        alive *= rates[k - 1]
        expected += alive * share
        gain = expected / costs[k]
        if k >= n_min and gain > best_gain * (1.0 + MARGIN if best_k == 0 else 1.0):
            best_k, best_gain = k, gain
    return best_k


# -- proposers ---------------------------------------------------------------------------


@dataclass
class Proposal:
    tokens: list[int]
    keys: list[Hashable]  # what backs each guess, for Acceptance (a draft model: none)


class Proposer(Protocol):
    """What guesses tokens: it follows the history and proposes up to k_max tokens."""

    def sync(self, tokens: Sequence[int]) -> None: ...
    def extend(self, tokens: Sequence[int]) -> None: ...
    def propose(self, k_max: int) -> Proposal | None: ...


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


class DraftModel:
    """A small model of the same vocabulary, decoding greedily in a session of its own."""

    def __init__(self, session: Session, p_min: float) -> None:
        self.session = session
        self.p_min = p_min
        self.history: list[int] = []
        self.confidence: list[float] = []  # the draft's own probability of each guess

    def sync(self, tokens: Sequence[int]) -> None:
        self.history = list(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        self.history.extend(tokens)

    def propose(self, k_max: int) -> Proposal | None:
        import numpy as np

        session = self.session
        if len(self.history) + k_max >= session.n_ctx:
            k_max = session.n_ctx - len(self.history) - 1
        if k_max < 1:
            return None
        session.prefill(self.history)
        guesses: list[int] = []
        self.confidence = []
        while True:
            logits = session.context.logits(-1)
            token = int(logits.argmax())
            top = float(logits[token])
            p = 1.0 / float(np.exp(logits - top).sum())
            if p < self.p_min or session.model.is_eog(token):
                break
            guesses.append(token)
            self.confidence.append(p)
            if len(guesses) >= k_max:
                break
            session.decode_token(token)
        return Proposal(guesses, []) if guesses else None


# -- the policy --------------------------------------------------------------------------


class Speculator:
    """Chooses each step's guesses and learns from the outcome. One per session: in a chat
    what it learned carries over from turn to turn.

    The costs it weighs come from a profile measured once (``calibrate``: batches of 1 ..
    n_max + 1 tokens on this model, device and settings, and a draft model's step) and
    kept by the caller (``profile``, ``on_measured``), not from the timings of the run:
    the guesses then depend on the tokens alone, so the same command gives the same text
    on every run, though the machine's speed varies from one to the next.
    """

    CALIBRATION_BUDGET_S = 1.0

    def __init__(self, params: SpecParams, proposer: Proposer | None = None, *,
                 profile: Mapping[str, Any] | None = None,
                 on_measured: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.params = params
        self.proposer = proposer if proposer is not None else PromptLookup(params.ngram_size)
        self.costs = CostModel(params.n_max + 1)
        self.draft_step = 0.0  # a draft-model step relative to a step of the model
        self.profile: dict[str, Any] | None = None
        if profile is not None:
            self._use(profile)
        self.on_measured = on_measured
        self.acceptance = Acceptance()
        self.draft_rate = [1.0, 1.0]  # accepted, tested (draft model: calibrates its own p)
        self._last: Proposal | None = None
        # Prompt lookup's recent proposals, whole (not only the guesses verified), each with
        # the index of its next guess to score against the tokens that come: [proposal, index]
        self._shadows: list[list[Any]] = []

    def close(self) -> None:
        if isinstance(self.proposer, DraftModel):
            self.proposer.session.close()

    @property
    def needs_profile(self) -> bool:
        """Whether `calibrate` must run before the first proposal (a fixed length weighs no costs)."""
        return self.profile is None and not self.params.fixed

    def _use(self, profile: Mapping[str, Any]) -> None:
        batch = {int(n): float(t) for n, t in profile["batch"].items()}
        for n, t in sorted(batch.items()):
            self.costs.observe(n, t)
        one, draft = batch.get(1), profile.get("draft_step")
        self.draft_step = float(draft) / one if draft and one else 0.0
        self.profile = {"batch": {str(n): t for n, t in batch.items()}, "draft_step": draft}

    def calibrate(self, measure: Callable[[int], float], room: int,
                  measure_draft: Callable[[], float] | None = None) -> None:
        """Measure the profile: `measure(n)` times one decode of n tokens with logits for each
        (a verification step), `measure_draft()` one step of the draft model; at most `room`
        tokens at once. Passed to ``on_measured`` for the caller to keep."""
        profile: dict[str, Any] = {"batch": measure_batches(measure, min(self.params.n_max + 1, room),
                                                            self.CALIBRATION_BUDGET_S),
                                   "draft_step": None}
        if measure_draft is not None:
            profile["draft_step"] = min(measure_draft() for _ in range(3))
        self._use(profile)
        if self.on_measured is not None and self.profile is not None:
            self.on_measured({"batch": dict(self.profile["batch"]), "draft_step": self.profile["draft_step"]})

    def start(self, tokens: Sequence[int]) -> None:
        """A generation begins after `tokens`."""
        self.proposer.sync(tokens)
        self._last = None
        self._shadows = []

    def extend(self, tokens: Sequence[int]) -> None:
        """Tokens were added to the history (the sampled one, the guesses accepted)."""
        if self._shadows:
            self._score(tokens)
        self.proposer.extend(tokens)

    def _score(self, tokens: Sequence[int]) -> None:
        """Score the kept proposals' guesses against the tokens that came, each up to its
        first wrong guess."""
        live = []
        for shadow in self._shadows:
            proposal, i = shadow
            guesses, keys = proposal.tokens, proposal.keys
            for token in tokens:
                right = guesses[i] == token
                self.acceptance.record(keys[i], right)
                i += 1
                if not right or i == len(guesses):
                    break
            else:
                shadow[1] = i
                live.append(shadow)
        self._shadows = live

    def propose(self, room: int, cost_of: Callable[[int], float] | None = None,
                share: float = 1.0) -> list[int]:
        """Guesses for the next step, at most `room` of them (possibly none).

        `cost_of(k)`: what the step costs with k guesses relative to without (default: the
        profile's batches of k + 1 against 1); `share`: see best_length."""
        if cost_of is None:
            cost_of = self._own_cost
        k_max = min(self.params.n_max, room)
        if k_max < max(self.params.n_min, 1):
            return []
        if isinstance(self.proposer, DraftModel):
            k_max = self._draft_limit(k_max, cost_of, share)
            if k_max < max(self.params.n_min, 1):
                return []
        proposal = self.proposer.propose(k_max)
        if proposal is not None and proposal.keys and not self.params.fixed:
            self._shadows.append([proposal, 0])  # scored as the text comes (Acceptance)
        if proposal is None or len(proposal.tokens) < max(self.params.n_min, 1):
            self._last = None
            return []
        k = len(proposal.tokens)
        if not self.params.fixed and isinstance(self.proposer, PromptLookup):
            rates = [self.acceptance.rate(key) for key in proposal.keys]  # as measured, per guess
            k = best_length(rates, [cost_of(n) for n in range(k + 1)], self.params.n_min, share)
        elif not self.params.fixed and isinstance(self.proposer, DraftModel):
            # a draft model: its own probabilities, calibrated by how often they came true
            calib = self.draft_rate[0] / self.draft_rate[1]
            rates = [min(p * calib, 0.999) for p in self.proposer.confidence[:k]]
            k = best_length(rates, self._draft_costs(cost_of, k), self.params.n_min, share)
        if k == 0:
            self._last = None
            return []
        self._last = Proposal(proposal.tokens[:k], proposal.keys[:k])
        return self._last.tokens

    def _own_cost(self, k: int) -> float:
        return self.costs.cost(k + 1)

    def _draft_limit(self, k_max: int, cost_of: Callable[[int], float], share: float) -> int:
        """The longest draft worth computing, if every guess were as likely as the draft's
        running acceptance says."""
        if self.params.fixed:
            return k_max
        rate = self.draft_rate[0] / self.draft_rate[1]
        k = best_length([min(rate, 0.999)] * k_max, self._draft_costs(cost_of, k_max), 0, share)
        return max(k, 1)

    def _draft_costs(self, cost_of: Callable[[int], float], k_max: int) -> list[float]:
        """The cost of a step with k = 0 .. k_max guesses of the draft model: verifying them
        and drafting them."""
        return [cost_of(n) + self.draft_step * n for n in range(k_max + 1)]

    def verified(self, proposed: int, accepted: int) -> None:
        """The outcome of the last proposal: `accepted` of `proposed` guesses were right."""
        last = self._last
        self.acceptance.fade()  # (the guesses themselves are scored as the tokens come: extend)
        if last is not None and isinstance(self.proposer, DraftModel):
            tested = min(accepted + 1, proposed)
            self.draft_rate[0] += accepted
            self.draft_rate[1] += sum(self.proposer.confidence[:tested])


def follow(speculator: Speculator, prompt: Sequence[int], reply: Sequence[int]) -> Iterator[tuple[int, int]]:
    """Drive `speculator` over a reply already written, as Session.generate does with a model
    that writes it (a guess is right where it equals the reply): each step's (guesses, right).
    For benchmarks and tests of the policy without a model."""
    speculator.start(prompt)
    pos = 0
    while pos < len(reply):
        speculator.extend([reply[pos]])
        room = len(reply) - pos - 1
        guesses = speculator.propose(room) if room > 0 else []
        right = 0
        while right < len(guesses) and guesses[right] == reply[pos + 1 + right]:
            right += 1
        speculator.verified(len(guesses), right)
        speculator.extend(guesses[:right])
        yield len(guesses), right
        pos += right + 1


def measure_batches(measure: Callable[[int], float], max_n: int, budget_s: float) -> dict[int, float]:
    """What a step of n tokens costs, in seconds, for n = 1 .. max_n.

    A plain step is a single-token decode in a run of them (a GPU replays those from a
    CUDA graph, much faster than it launches a batch's kernels). A step of n > 1 is its
    batch plus what it adds to the single step after it (the graph captured again), so
    both are timed together. Each size takes the fastest of two tries, in an order that
    covers the range early (1, max_n, the middle, then the gaps between); measuring
    stops once `budget_s` is spent, three sizes at least. The CostModel reads the sizes
    left out off its line."""
    order, spans = [max_n] if max_n > 1 else [], [(1, max_n)]
    while spans:
        lo, hi = spans.pop(0)
        if hi - lo > 1:
            mid = (lo + hi) // 2
            order.append(mid)
            spans += [(lo, mid), (mid, hi)]
    deadline = time.perf_counter() + budget_s
    for _ in range(2):  # warm-up
        measure(1)
    single = min(measure(1) for _ in range(4))
    best: dict[int, float] = {1: single}
    for _ in range(2):
        for n in order:
            if len(best) >= min(3, len(order) + 1) and time.perf_counter() > deadline:
                return best
            seconds = measure(n) + max(measure(1) - single, 0.0)
            best[n] = min(best.get(n, seconds), seconds)
    return best


def verify(chain: SamplerChain, context: Context, base: int, guesses: Sequence[int],
           take: Callable[[int], bool],
           on_sample: Callable[[int], None] | None = None) -> tuple[int, int | None]:
    """Check guesses against the request's own sampler chain, one sample per position.

    The batch just decoded holds the pending token at output `base` and the guesses after
    it. The chain samples at each output in turn while the sample equals the guess there;
    `take(token)` receives every accepted guess and says whether generation ends with it.
    Returns how many guesses were accepted and the token sampled after them (the first
    mismatch, or one more when all were right), None if generation ended inside the run.
    `on_sample(output)` is called before each sample (for tests that inspect the logits).
    """
    for i, guess in enumerate(guesses):
        if on_sample is not None:
            on_sample(base + i)
        token = chain.sample(context, base + i)
        if token != guess:
            return i, token
        if take(token):
            return i + 1, None
    if on_sample is not None:
        on_sample(base + len(guesses))
    return len(guesses), chain.sample(context, base + len(guesses))


def check_compatible(model: Model, draft: Model) -> None:
    """Raise a UsageError saying what differs if `draft` cannot propose tokens for `model`
    (the checks of llama.cpp's speculative example: vocabulary type and size, special
    tokens, and every token's text)."""
    from infer.runtime.llama import vocab_type

    def differs(what: str, a: object, b: object) -> UsageError:
        return UsageError(f"the draft model {draft.path.name} cannot draft for {model.path.name}: "
                          f"{what} is {b} in the draft and {a} in the model")

    if vocab_type(model) != vocab_type(draft):
        raise differs("the vocabulary type", vocab_type(model), vocab_type(draft))
    if abs(model.n_vocab - draft.n_vocab) > 128:
        raise differs("the vocabulary size", model.n_vocab, draft.n_vocab)
    for what, a, b in (("add-BOS", model.add_bos, draft.add_bos), ("BOS", model.bos, draft.bos),
                       ("EOS", model.eos, draft.eos)):
        if a != b:
            raise differs(what, a, b)
    for token in range(5, min(model.n_vocab, draft.n_vocab)):
        a, b = model.token_bytes(token, special=True), draft.token_bytes(token, special=True)
        if a != b:
            raise differs(f"token {token}", repr(a.decode("utf-8", "replace")),
                          repr(b.decode("utf-8", "replace")))
