"""A chat: messages rendered through the chat template, each turn prefilling only what is new.

Every turn renders the whole conversation; the session keeps the longest common
prefix of that and its KV cache, so turn N prefills the new message and the
template's markup, not the history. When the next turn would not fit the context,
the oldest exchanges are dropped (never the system prompt), or, with the ``error``
policy, the turn fails with ContextOverflowError.

With a prompt cache, a turn that starts from an empty (or unrelated) KV cache first
loads the saved state sharing the longest prefix with its prompt, and a long system
prompt prefilled for the first time is saved, so that the next chat with the same
system prompt starts without prefilling it again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from infer.runtime.errors import ContextOverflowError, UsageError
from infer.runtime.messages import CONTEXT_POLICIES, Dropped, Messages, check_context_policy
from infer.runtime.prompt import preamble_len
from infer.runtime.sampling import SamplingParams
from infer.runtime.session import Completion, Piece, Session, common_prefix_len
from infer.runtime.thinking import split_events
from infer.runtime.thinking_prompt import ThinkingPrompt, ThinkingRequest, thinking_prompt

if TYPE_CHECKING:
    from infer.runtime.prompt_cache import PromptCache

__all__ = ["CONTEXT_POLICIES", "Conversation", "Dropped"]

# Room kept for the reply when no token limit is set.
DEFAULT_REPLY_ROOM = 256


class Conversation(Messages):
    """Messages (system prompt first), the session that runs them, and the context policy."""

    def __init__(self, session: Session, *, system: str | None = None, template: str | None = None,
                 context_policy: str = "drop-oldest", prompt_cache: PromptCache | None = None,
                 cache_name: str = "") -> None:
        self.session = session
        self.template = template
        self.context_policy = check_context_policy(context_policy)
        self.prompt_cache = prompt_cache
        self.cache_name = cache_name  # the model's name in `infer cache list`
        self.thinking = ThinkingRequest()  # a thinking model's settings (/think, /set reasoning-budget)
        super().__init__(system)

    def tokens(self, messages: list[dict[str, Any]] | None = None) -> list[int]:
        """The prompt tokens of `messages` (default: the conversation) with the reply opened."""
        return self._render(messages if messages is not None else self.messages).tokens

    def _render(self, messages: list[dict[str, Any]]) -> ThinkingPrompt:
        """The prompt of `messages`, with a thinking model's settings and plan (self.thinking)."""
        return thinking_prompt(self.session.model, messages, template=self.template, request=self.thinking)

    def send(self, text: str, params: SamplingParams) -> Iterator[Piece | Completion | Dropped]:
        """Add a user message and generate the reply, streaming events."""
        self.messages.append({"role": "user", "content": text})
        try:
            rendered, dropped = self._fit(params)
        except ContextOverflowError:
            self.messages.pop()  # the message that does not fit is not kept
            raise
        yield from self._reply(params, rendered, dropped)

    def retry(self, params: SamplingParams) -> Iterator[Piece | Completion | Dropped]:
        """Generate the last reply again (the KV cache is cut back to before it)."""
        last_user = self._last_user_index()
        if last_user is None:
            raise UsageError("nothing to retry yet")
        del self.messages[last_user + 1:]
        rendered, dropped = self._fit(params)
        yield from self._reply(params, rendered, dropped)

    def _reply(self, params: SamplingParams, rendered: ThinkingPrompt,
               dropped: int) -> Iterator[Piece | Completion | Dropped]:
        """The reply's events (a thinking model's reasoning as `Thought`s), recorded."""
        if dropped:
            yield Dropped(dropped)
        tokens = rendered.tokens
        events = self.session.generate(tokens, params, thinking=rendered.plan,
                                       **self._through_cache(tokens, rendered.variables))
        yield from self.recorded(split_events(events, rendered.plan, self.session.model))

    def _fit(self, params: SamplingParams) -> tuple[ThinkingPrompt, int]:
        """The next prompt's tokens, dropping the oldest exchanges if the policy allows."""
        room = params.max_tokens if params.max_tokens is not None else DEFAULT_REPLY_ROOM
        n_ctx = self.session.n_ctx
        dropped = 0
        while True:
            rendered = self._render(self.messages)
            if len(rendered.tokens) + room <= n_ctx:
                return rendered, dropped
            if self.context_policy == "error" or not self.drop_oldest():
                raise ContextOverflowError(prompt_tokens=len(rendered.tokens), max_tokens=room, n_ctx=n_ctx)
            dropped += 1

    def _through_cache(self, tokens: list[int], variables: dict[str, Any]) -> dict[str, Any]:
        """Options for Session.generate with the prompt cache: load the best saved state if
        the session holds too little of `tokens`, and save one where the last message
        begins (after the system prompt) when this turn prefills that far."""
        cache = self.prompt_cache
        if cache is None:
            return {}
        if common_prefix_len(self.session.tokens, tokens) >= cache.min_tokens:
            return {}  # a later turn: the session holds the conversation so far
        started = time.perf_counter()  # loading a state counts towards time to first token
        held = cache.restore(self.session, tokens)
        preamble = preamble_len(self.session.model, self.messages, tokens, template=self.template,
                                variables=variables)
        if preamble < cache.min_tokens or held >= preamble:
            return {"started": started}
        return {"started": started, "checkpoints": (preamble,),
                "on_checkpoint": lambda _n: cache.store(self.session, self.cache_name, wait=False)}
