"""A draft model: ``DraftModel`` proposes with a small model of the same vocabulary;
``check_compatible`` says whether a draft can propose for a model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from infer.runtime.errors import UsageError
from infer.runtime.speculative.proposal import Proposal

if TYPE_CHECKING:
    from infer.runtime.llama import Context, Model


class DraftSession(Protocol):
    """What a draft model decodes in: a ``Session`` (runtime/session.py) of its own. Typed
    here rather than imported, since the session module imports this package."""

    @property
    def n_ctx(self) -> int: ...
    @property
    def context(self) -> Context: ...
    @property
    def model(self) -> Model: ...
    def prefill(self, tokens: Sequence[int]) -> int: ...
    def decode_token(self, token: int) -> None: ...
    def time_decode(self, n: int) -> float: ...
    def close(self) -> None: ...


class DraftModel:
    """A small model of the same vocabulary, decoding greedily in a session of its own."""

    def __init__(self, session: DraftSession, p_min: float) -> None:
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
