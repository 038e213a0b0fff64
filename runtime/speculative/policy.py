"""The policy: ``Speculator`` chooses each step's guesses from the measured costs and
acceptance (``best_length``) and learns from the outcome."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from infer.runtime.speculative.acceptance import Acceptance
from infer.runtime.speculative.costs import CostModel, measure_batches
from infer.runtime.speculative.draft import DraftModel
from infer.runtime.speculative.lookup import PromptLookup
from infer.runtime.speculative.params import SpecParams
from infer.runtime.speculative.proposal import Proposal, Proposer

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
