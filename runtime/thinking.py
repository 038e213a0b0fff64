"""A thinking model's reasoning while one reply is generated (issue 32): how the reply begins,
the budget of thinking tokens, and the answer-only constraints.

For one prompt, a `ThinkingPlan` (made by runtime/thinking_prompt.py) says how the reply
begins (inside the block the generation prompt opened, after a block the prompt closed, or
free to open one) and how many tokens of thinking it may have (--reasoning-budget,
`reasoning_budget`). Every generation of that prompt (each choice of a request) follows its
own text with a `ThinkingTrack`; `Generation` (runtime/generation.py) uses it to hold a
grammar and stop strings back while the model thinks, so that they constrain the answer
alone, and the session or the scheduler to close the block when the budget is spent. The
reply's reasoning is then taken apart from its answer (`split_events`, `split_completion`).

The markers come from the chat template (runtime/reasoning.py); a model without a convention
has no plan, and generation is what it always was.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from infer.runtime.reasoning import ReasoningFormat, ReasoningSplitter

START_RULE = "infer-reasoning-start"  # the grammar's root while a reply may open the block
ANSWER_RULE = "infer-answer"  # the answer's grammar, its wrapper allowed first (gpt-oss' final channel)


@dataclass(frozen=True)
class ThinkingPlan:
    """How a prompt's reply begins and how long it may think."""

    fmt: ReasoningFormat
    opened: bool | None  # True: inside the block; False: after a block the prompt closed; None: free
    limit: int | None = None  # tokens of thinking at most (None: no limit)
    close_tokens: tuple[int, ...] = ()  # the closing marker's tokens, written when the budget is spent
    # The markers' control tokens (gpt-oss's <|channel|>...): the text shows them, so that the
    # markers can be seen in it (a control token's text is otherwise empty)
    special: frozenset[int] = frozenset()
    lead: str = ""  # what the prompt wrote inside the block it opened (reasoning.ReasoningSplitter)

    def token_bytes(self, model: Any) -> Callable[[int], bytes]:
        """The text of a token of the reply, a marker's control token shown."""
        special = self.special
        return lambda token: model.token_bytes(token, special=token in special)

    def splitter(self) -> ReasoningSplitter:
        """A splitter for a reply to this prompt (the reasoning apart from the answer)."""
        return ReasoningSplitter(self.fmt, inside=self.opened is True, closed=self.opened is False,
                                 lead=self.lead)

    def track(self) -> ThinkingTrack:
        return ThinkingTrack(self)

    def start_grammar(self, grammar: str) -> tuple[str, str] | None:
        """The grammar (text, root rule) a reply free to open the block starts under: its opening
        marker or an answer that follows `grammar`. None where there is no marker to open with."""
        if not self.fmt.open:
            return None
        answer, root = self._wrapped(grammar, "root")
        return f"{answer}\n{START_RULE} ::= {json.dumps(self.fmt.open)} | {root}\n", START_RULE

    def answer_grammar(self, spec: Any) -> Any:
        """The grammar sampler's settings for the answer (runtime.llama.sampler_chain.SamplerSpec):
        `spec`'s grammar, after the answer's header where the format has one and the model may
        write it (gpt-oss' "<|channel|>final<|message|>", in the new turn the reasoning ended
        with, after which the grammar's text begins). A wrapper with a closing marker around the
        answer (Granite's <response>) and a grammar that waits for a trigger are left as they are."""
        args = spec.args
        if not self.fmt.answer_open or self.fmt.answer_close or (len(args) > 2 and args[2]):
            return spec
        return type(spec)(spec.kind, self._wrapped(args[0], args[1] if len(args) > 1 else "root"))

    def _wrapped(self, grammar: str, root: str) -> tuple[str, str]:
        if not self.fmt.answer_open or self.fmt.answer_close:
            return grammar, root
        return f"{grammar}\n{ANSWER_RULE} ::= {json.dumps(self.fmt.answer_open)}? {root}\n", ANSWER_RULE


class ThinkingTrack:
    """One reply's text as it is taken: where it is (the splitter's state: "start", "thinking",
    "after" the closing marker, "answer") and whether its budget is spent."""

    def __init__(self, plan: ThinkingPlan) -> None:
        self.plan = plan
        self.split = plan.splitter()
        self.spent = False

    @property
    def state(self) -> str:
        return self.split.state

    @property
    def thinking(self) -> bool:
        return self.split.state == "thinking"

    def feed(self, text: str) -> None:
        self.split.feed(text)

    def due(self, generated: int) -> bool:
        """Whether to close the block now, `generated` tokens into the reply (once)."""
        limit = self.plan.limit
        if limit is None or self.spent or not self.thinking or generated < limit:
            return False
        self.spent = True
        return True


def split_events(events: Iterable[Any], plan: ThinkingPlan | None, model: Any) -> Iterator[Any]:
    """A generation's events (Piece ..., Completion) with a thinking model's reasoning apart
    (its prompt's `plan`): `Thought`s for the reasoning, `Piece`s for the answer, and the
    Completion's text the answer alone, its reasoning and reasoning tokens set. Without a plan,
    the events as they are."""
    from infer.runtime.results import Completion, Piece, Thought

    if plan is None:
        yield from events
        return
    splitter, token_bytes = plan.splitter(), plan.token_bytes(model)

    def parts(reasoning: str, answer: str) -> Iterator[Any]:
        if reasoning:
            yield Thought(reasoning)
        if answer:
            yield Piece(answer)

    for event in events:
        if isinstance(event, Piece):
            yield from parts(*splitter.feed(event.text))
            continue
        if isinstance(event, Completion):
            yield from parts(*splitter.finish())
            _settle(event, splitter, token_bytes)
        yield event


def split_completion(completion: Any, plan: ThinkingPlan | None, model: Any) -> Any:
    """A whole Completion with its reasoning apart (see `split_events`)."""
    if plan is not None:
        splitter = plan.splitter()
        splitter.feed(completion.text)
        splitter.finish()
        _settle(completion, splitter, plan.token_bytes(model))
    return completion


def _settle(completion: Any, splitter: ReasoningSplitter, token_bytes: Callable[[int], bytes]) -> None:
    """Set a Completion's text to the answer alone and its reasoning (and reasoning tokens) apart,
    from a splitter fed all of its text."""
    from infer.runtime.reasoning import reasoning_tokens

    completion.reasoning_tokens = reasoning_tokens(token_bytes, completion.tokens, completion.text,
                                                   splitter.answer_from) if splitter.reasoning else 0
    completion.text, completion.reasoning = splitter.answer, splitter.reasoning
