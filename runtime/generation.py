"""One sequence's generation: the decode step that a session (`infer run`, `infer chat`) and
the scheduler (`infer batch`, `infer serve`) share.

After a decode that computed the logits of a sequence's pending token (and of the tokens
guessed after it), a step samples with the request's own chain, checks the guesses
(``speculative.verify``), takes each accepted token (end of generation, stop strings, the
token limit), counts what was guessed and accepted, and tells the caller how many guessed
positions its KV cache must drop. The caller owns the batch and the cache; this owns
the sampler chain, the text stream and the tally, and builds the `Completion`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from infer.runtime.llama import SamplerSpec
from infer.runtime.results import Completion, Timings, Usage
from infer.runtime.sampling import build_sampler_chain
from infer.runtime.speculative import Speculator, verify
from infer.runtime.textstream import TextStream

TYPE_CHECKING = False
if TYPE_CHECKING:
    from infer.runtime.thinking import ThinkingPlan


def take_token(model: Any, params: Any, stream: TextStream, generated: list[int],
               limit: int, token: int, special: frozenset[int] = frozenset()) -> tuple[str, str | None]:
    """Take one sampled token into `generated` and `stream`: the text it makes final, and why
    generation ends with it ("eos", "stop", "length") if it does. An end-of-generation
    token ends it without being kept (unless `ignore_eos`). The `special` control tokens are
    shown as their text (a thinking model's markers)."""
    if model.is_eog(token) and not params.ignore_eos:
        return "", "eos"
    generated.append(token)
    text = stream.feed(model.token_bytes(token, special=token in special))
    if stream.stopped_by is not None:
        return text, "stop"
    return text, "length" if len(generated) >= limit else None


class Step(NamedTuple):
    """What one step did: the text it made final, why generation ended (None: it goes on with
    `next_token`, still to be decoded), and how many guessed positions the cache must drop."""

    text: str
    finish: str | None
    next_token: int | None
    rejected: int


class Generation:
    """A request's tokens being generated: its parameters (with a concrete seed), sampler
    chain, token limit, text and tokens so far, and its speculator's tally.

    A thinking model's reply (`thinking`: its prompt's plan) is followed as it is taken: while
    the model thinks, the grammar (--grammar, --json-schema) and the stop strings are held
    back, so that they constrain the answer alone; a reply free to open the block starts under
    a grammar that takes the opening marker or the answer."""

    def __init__(self, model: Any, params: Any, limit: int, spec: Speculator | None = None, *,
                 thinking: ThinkingPlan | None = None) -> None:
        self.model, self.params, self.limit, self.spec = model, params, limit, spec
        self.chain = build_sampler_chain(params, model)
        self.stream = TextStream(params.stop)
        self.generated: list[int] = []
        self.drafted = self.accepted = 0
        self.track = thinking.track() if thinking is not None else None
        # (the control tokens the text shows: the reasoning's markers, a tool call's)
        self.special = params._shown_tokens | (thinking.special if thinking is not None else frozenset())
        if self.track is not None and self.track.state in ("start", "thinking"):
            self._constrain("start", self.track.state)

    def close(self) -> None:
        self.chain.close()

    def take(self, token: int) -> tuple[str, str | None]:
        track = self.track
        text, ended = take_token(self.model, self.params, self.stream, self.generated, self.limit, token,
                                 self.special)
        if track is not None and text:
            before = track.state
            track.feed(text)
            if track.state != before:
                self._constrain(before, track.state)
        return text, ended

    def thinking_due(self) -> bool:
        """Whether the reasoning budget is spent now: the caller writes the closing marker."""
        return self.track is not None and self.track.due(len(self.generated))

    def write_closer(self, token: int) -> tuple[str, list[int], str | None]:
        """After the pending `token`, take the reasoning's closing marker as if the model had
        written it (the budget is spent): its text, the tokens taken (all of them, unless the
        reply ends inside the marker), and why the reply ends, if it does. The caller decodes
        the pending token and those tokens."""
        assert self.track is not None
        closer = list(self.track.plan.close_tokens)
        if self.spec is not None:
            self.spec.extend((token, *closer))
        texts: list[str] = []
        for n, forced in enumerate(closer):
            text, ended = self.take(forced)
            texts.append(text)
            if ended is not None:
                return "".join(texts), closer[:n + 1], ended
        return "".join(texts), closer, None

    def _constrain(self, before: str, state: str) -> None:
        """The grammar and stop strings for the reply's new `state` (runtime/thinking.py)."""
        assert self.track is not None
        grammar = self.params.effective_grammar
        if state == "thinking":
            self.stream.set_stops(())
            if grammar is not None:
                self.chain.set_grammar(None)
        elif state == "start" and grammar is not None and not self.params._grammar_triggers:
            start = self.track.plan.start_grammar(grammar)  # (a lazy grammar waits anyway)
            if start is not None:
                self.chain.set_grammar(SamplerSpec("grammar", start))
        elif before == "thinking":  # the answer begins: constrained from its first token
            self.stream.set_stops(self.params.stop)
            if grammar is not None:
                self.chain.set_grammar(self.track.plan.answer_grammar(self.params.grammar_spec))

    def propose(self, token: int, room: int, cost_of: Callable[[int], float] | None = None,
                share: float = 1.0) -> list[int]:
        """The guesses after `token` (the pending token, about to be decoded), at most `room`."""
        if self.spec is None:
            return []
        self.spec.extend((token,))
        return self.spec.propose(room, cost_of, share=share)

    def step(self, context: Any, base: int, guesses: Sequence[int] = (),
             on_sample: Callable[[int], None] | None = None) -> Step:
        """Sample at output `base` of the batch just decoded, checking the `guesses` decoded
        after the pending token there; take the accepted tokens and the one sampled after them."""
        texts: list[str] = []
        endings: list[str] = []

        def take(token: int) -> bool:
            text, ended = self.take(token)
            if text:
                texts.append(text)
            if ended is not None:
                endings.append(ended)
            return ended is not None

        right, after = verify(self.chain, context, base, guesses, take, on_sample)
        if self.spec is not None and self.generated:  # (not the prefill's token: nothing was proposed)
            self.spec.verified(len(guesses), right)
            self.spec.extend(guesses[:right])
        if guesses:
            self.drafted += len(guesses)
            self.accepted += right
        finish = endings[-1] if after is None or take(after) else None
        return Step("".join(texts), finish, after if finish is None else None, len(guesses) - right)

    def completion(self, finish: str, prompt_tokens: int, cached: int, timings: Timings) -> Completion:
        usage = Usage(prompt_tokens, cached, len(self.generated), self.drafted, self.accepted)
        return Completion(self.stream.text, finish, usage, timings, self.params.seed,
                          self.stream.stopped_by if finish == "stop" else None, self.generated)
