"""A grammar that waits for its trigger (`tool_choice: auto`, issue 33): the reply is free
until its text matches a trigger pattern, then held to the grammar from the pattern's group on.

llama.cpp has this (`llama_sampler_init_grammar_lazy_patterns`), but when the token that
completes the trigger carries on in a way the grammar refuses, its replay throws a C++
exception through the C API and the process ends. So infer watches for the trigger itself and
gives the chain a plain grammar only once that grammar has taken the text from the group on,
checked token by token with llama_sampler_apply (which refuses without throwing). Where the
grammar refuses that text, the reply goes on free (the call reader then finds no call, or a
call the model wrote on its own) instead of ending the process.
"""

from __future__ import annotations

import ctypes
import math
import re
from typing import TYPE_CHECKING, Any

from infer.runtime.llama.bindings import C

if TYPE_CHECKING:
    from infer.runtime.llama.model import Model


def allows(grammar: Any, token: int) -> bool:
    """Whether the grammar sampler `grammar` takes `token` next (its state unchanged)."""
    one = C.llama_token_data(token, 0.0, 0.0)
    cur = C.llama_token_data_array(ctypes.pointer(one), 1, -1, False)
    C.llama_sampler_apply(grammar, ctypes.byref(cur))
    return cur.data[0].logit != -math.inf


class GrammarTrigger:
    """Watches the accepted tokens for the trigger patterns (regular expressions over the whole
    text so far, as llama.cpp's: a full match whose first group is where the grammar starts)."""

    def __init__(self, model: Model, grammar: str, root: str, patterns: tuple[str, ...]) -> None:
        self._model, self.grammar, self.root = model, grammar, root
        self.patterns = tuple(re.compile(p.encode("utf-8")) for p in patterns)
        self._text = b""
        self._ends: list[int] = []  # where each accepted token's piece ends in _text
        self._tokens: list[int] = []

    def copy(self) -> GrammarTrigger:
        twin = GrammarTrigger.__new__(GrammarTrigger)
        twin.__dict__.update(self.__dict__)
        twin._ends, twin._tokens = list(self._ends), list(self._tokens)
        return twin

    def feed(self, token: int, make: Any) -> tuple[bool, Any]:
        """Take one accepted token. (False, None) while the trigger is awaited; once it is
        complete, (True, the grammar sampler in the state after the text from the group on),
        or (True, None) where that grammar refuses the text. `make` builds a grammar sampler
        from (grammar, root)."""
        self._text += self._model.token_bytes(token, special=True)
        self._ends.append(len(self._text))
        self._tokens.append(token)
        for pattern in self.patterns:
            match = pattern.fullmatch(self._text)
            if match:
                return True, self._held(match.start(1), make)
        return False, None

    def _held(self, start: int, make: Any) -> Any:
        grammar = make(self.grammar, self.root)
        for token in self._replayed(start):
            if not allows(grammar, token):
                C.llama_sampler_free(grammar)
                return None
            C.llama_sampler_accept(grammar, token)
        return grammar

    def _replayed(self, start: int) -> list[int]:
        """Tokens whose pieces make the text from `start` on: the accepted ones, the first of
        them (where the group starts inside it) tokenized again from there."""
        tokens = []
        for i, end in enumerate(self._ends):
            if end <= start:
                continue
            begin = self._ends[i - 1] if i else 0
            if begin >= start:
                tokens.append(self._tokens[i])
            else:
                part = self._text[start:end].decode("utf-8", errors="replace")
                tokens += self._model.tokenize(part, add_special=False, parse_special=False)
        return tokens
