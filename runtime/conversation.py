"""A chat: messages rendered through the chat template, each turn prefilling only what is new.

Every turn renders the whole conversation; the session keeps the longest common
prefix of that and its KV cache, so turn N prefills the new message and the
template's markup, not the history. When the next turn would not fit the context,
the oldest exchanges are dropped (never the system prompt), or, with the ``error``
policy, the turn fails with ContextOverflowError.

A user message may carry images or audio (its "media": runtime.media.Medium, in the order of
the markers its content holds); with the model's projector they are read in place, and, being
part of the cached prefix, an image is encoded once: the turns after it prefill only what is new.

With a prompt cache, a turn that starts from an empty (or unrelated) KV cache first
loads the saved state sharing the longest prefix with its prompt, and a long system
prompt prefilled for the first time is saved, so that the next chat with the same
system prompt starts without prefilling it again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from infer.runtime.errors import ContextOverflowError, MediaError, UsageError
from infer.runtime.media import MediaPrompt, Medium, media_of, media_prompt, place_markers, text_only
from infer.runtime.messages import CONTEXT_POLICIES, Dropped, Messages, check_context_policy
from infer.runtime.prompt import adds_bos, preamble_len
from infer.runtime.sampling import SamplingParams
from infer.runtime.session import Completion, Piece, Session, common_prefix_len
from infer.runtime.thinking import split_events
from infer.runtime.thinking_prompt import ThinkingPrompt, ThinkingRequest, thinking_prompt

if TYPE_CHECKING:
    from infer.runtime.llama import Projector
    from infer.runtime.prompt_cache import PromptCache

__all__ = ["CONTEXT_POLICIES", "Conversation", "Dropped"]

# Room kept for the reply when no token limit is set.
DEFAULT_REPLY_ROOM = 256


class Conversation(Messages):
    """Messages (system prompt first), the session that runs them, and the context policy."""

    def __init__(self, session: Session, *, system: str | None = None, template: str | None = None,
                 context_policy: str = "drop-oldest", prompt_cache: PromptCache | None = None,
                 cache_name: str = "", projector: Projector | None = None) -> None:
        self.session = session
        self.projector = projector  # reads the messages' media (None: the model takes none)
        self.template = template
        self.context_policy = check_context_policy(context_policy)
        self.prompt_cache = prompt_cache
        self.cache_name = cache_name  # the model's name in `infer cache list`
        self.thinking = ThinkingRequest()  # a thinking model's settings (/think, /set reasoning-budget)
        super().__init__(system)

    def tokens(self, messages: list[dict[str, Any]] | None = None) -> list[int]:
        """The prompt tokens of `messages` (default: the conversation) with the reply opened."""
        _, tokens, media = self._prompt(messages if messages is not None else self.messages)
        if media is not None:
            media.close()
        return tokens

    def _render(self, messages: list[dict[str, Any]]) -> ThinkingPrompt:
        """The prompt of `messages`, with a thinking model's settings and plan (self.thinking)."""
        return thinking_prompt(self.session.model, text_only(messages), template=self.template,
                               request=self.thinking)

    def _prompt(self, messages: list[dict[str, Any]]) -> tuple[ThinkingPrompt, list[int], MediaPrompt | None]:
        """The rendering of `messages`, its tokens with the media in them, and the media's
        chunks (close them after use)."""
        rendered = self._render(messages)
        media = media_of(messages)
        if not media:
            return rendered, rendered.tokens, None
        if self.projector is None:
            raise MediaError(f"{media[0].name}: this model reads no {media[0].kind} (no --mmproj)")
        text, model = rendered.prompt.text, self.session.model
        mp = media_prompt(self.projector, text, media, add_special=adds_bos(model, text),
                          limit=None)  # (a chat's media add up over its turns)
        return rendered, mp.tokens + rendered.tokens[len(rendered.prompt.tokens):], mp

    def send(self, text: str, params: SamplingParams,
             media: tuple[Medium, ...] = ()) -> Iterator[Piece | Completion | Dropped]:
        """Add a user message (with its images or audio) and generate the reply, streaming events."""
        message: dict[str, Any] = {"role": "user", "content": text}
        if media:
            message.update(content=place_markers(text, len(media)), media=tuple(media))
        self.messages.append(message)
        try:
            rendered, tokens, mp, dropped = self._fit(params)
        except (ContextOverflowError, MediaError):
            self.messages.pop()  # the message that cannot be sent is not kept
            raise
        yield from self._reply(params, rendered, tokens, mp, dropped)

    def retry(self, params: SamplingParams) -> Iterator[Piece | Completion | Dropped]:
        """Generate the last reply again (the KV cache is cut back to before it)."""
        last_user = self._last_user_index()
        if last_user is None:
            raise UsageError("nothing to retry yet")
        del self.messages[last_user + 1:]
        yield from self._reply(params, *self._fit(params))

    def _reply(self, params: SamplingParams, rendered: ThinkingPrompt, tokens: list[int],
               media: MediaPrompt | None, dropped: int) -> Iterator[Piece | Completion | Dropped]:
        """The reply's events (a thinking model's reasoning as `Thought`s), recorded."""
        if dropped:
            yield Dropped(dropped)
        try:
            events = self.session.generate(tokens, params, thinking=rendered.plan, media_prompt=media,
                                           **self._through_cache(tokens, rendered.variables))
            yield from self.recorded(split_events(events, rendered.plan, self.session.model))
        finally:
            if media is not None:
                media.close()

    def _fit(self, params: SamplingParams) -> tuple[ThinkingPrompt, list[int], MediaPrompt | None, int]:
        """The next prompt (its rendering, tokens and media), dropping the oldest exchanges if
        the policy allows; and how many were dropped."""
        room = params.max_tokens if params.max_tokens is not None else DEFAULT_REPLY_ROOM
        n_ctx = self.session.n_ctx
        dropped = 0
        while True:
            rendered, tokens, media = self._prompt(self.messages)
            if len(tokens) + room <= n_ctx:
                return rendered, tokens, media, dropped
            if media is not None:
                media.close()
            if self.context_policy == "error" or not self.drop_oldest():
                raise ContextOverflowError(prompt_tokens=len(tokens), max_tokens=room, n_ctx=n_ctx)
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
        preamble = preamble_len(self.session.model, text_only(self.messages), tokens,
                                template=self.template, variables=variables)
        if preamble < cache.min_tokens or held >= preamble:
            return {"started": started}
        return {"started": started, "checkpoints": (preamble,),
                "on_checkpoint": lambda _n: cache.store(self.session, self.cache_name, wait=False)}

