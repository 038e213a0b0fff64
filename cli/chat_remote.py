"""`infer chat` through a running `infer serve` (--server URL or INFER_SERVER).

Each turn sends the whole conversation to the server's /v1/chat/completions; the server's
slots keep the KV cache of what they last ran, so a turn prefills only the new message
there as it does here. The chat looks and behaves as it does with the model loaded here:
the same line editor, the same slash commands, the same replies. What belongs where the
model is loaded is the server's: its context size (`/set ctx` is refused), its template,
and the KV cache (`/save` and `/load` keep only the messages and parameters: a session
saved here continues with the model loaded locally too, and the other way round).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Mapping
from functools import partial
from typing import Any

from infer.cli import remote
from infer.cli.chat_commands import BaseChat
from infer.cli.chat_files import (
    messages_from_json,
    messages_to_json,
    read_session,
    saved_params,
    write_session,
)
from infer.cli.chat_output import note, say
from infer.cli.chat_settings import PROMPT_SETTINGS, list_overrides, parse_setting
from infer.cli.flags import prompt_flags, thinking_request
from infer.cli.render import reply_writer
from infer.cli.thinking_display import thinking_display
from infer.runtime.errors import InferError, ModelNotFoundError, NetworkError, UsageError
from infer.runtime.media import openai_message
from infer.runtime.messages import Dropped, Messages, check_context_policy

CHAT_PATH = "/v1/chat/completions"


class RemoteConversation(Messages):
    """The chat's messages, each turn sent whole to the server at `where`."""

    def __init__(self, where: remote.Address, model: str, *, system: str | None,
                 context_policy: str = "drop-oldest") -> None:
        super().__init__(system)
        self.where = where
        self.model = model
        self.context_policy = check_context_policy(context_policy)

    def send(self, text: str, fields: Mapping[str, Any], media: tuple[Any, ...] = ()) -> Iterator[Any]:
        """Add a user message and stream the server's reply (Piece ..., Completion)."""
        from infer.runtime.media import place_markers

        message = {"role": "user", "content": place_markers(text, len(media)), "media": tuple(media)}
        self.messages.append(message if media else {"role": "user", "content": text})
        yield from self._reply(fields, new=True)

    def retry(self, fields: Mapping[str, Any]) -> Iterator[Any]:
        """Generate the last reply again."""
        last_user = self._last_user_index()
        if last_user is None:
            raise UsageError("nothing to retry yet")
        del self.messages[last_user + 1:]
        yield from self._reply(fields, new=False)

    def _reply(self, fields: Mapping[str, Any], *, new: bool) -> Iterator[Any]:
        dropped = 0
        while True:  # the server refuses a conversation that no longer fits its context
            messages = [openai_message(m) for m in self.messages]  # (media as data: URLs)
            body = {"model": self.model, "messages": messages, "stream": True,
                    "stream_options": {"include_usage": True}, **fields}
            replies = remote.events(self.where, CHAT_PATH, body)
            try:
                first = next(replies)
            except remote.ContextTooLong:
                if self.context_policy != "error" and self.drop_oldest():
                    dropped += 1
                    continue
                if new:
                    self.messages.pop()  # the message that does not fit is not kept
                raise
            except InferError:
                if new:
                    self.messages.pop()
                raise
            except BaseException:  # Ctrl-C before the first token: the reply is empty, as here
                replies.close()
                self.messages.append({"role": "assistant", "content": ""})
                raise
            break
        if dropped:
            yield Dropped(dropped)
        try:
            yield from self.recorded(itertools.chain((first,), replies))
        finally:
            replies.close()  # (Ctrl-C: the connection closes and the server stops the request)


class RemoteChat(BaseChat):
    """The chat's state and slash commands, with the model loaded in a server."""

    def __init__(self, flags: Mapping[str, Any], where: remote.Address, overrides: dict[str, Any]) -> None:
        model = flags["model"]
        system = flags["system"] if flags["system"] is not None else remote.alias_system(model)
        self.where = where
        self.conversation: Any = RemoteConversation(where, model, system=system,
                                                    context_policy=flags["context_policy"])
        self.overrides = overrides
        self.prompt_settings = prompt_flags(flags)
        self.thinking: dict[str, Any] = {}  # the request's fields for them (remote.thinking_fields)
        self._apply_thinking(thinking_request(self.prompt_settings))
        self.reply = partial(reply_writer, flags["plain"])
        self.thoughts = partial(thinking_display, flags)
        self.last: Any = None

    def _apply_thinking(self, request: Any) -> None:
        self.thinking = remote.thinking_fields(request.think, request.variables, request.budget)
        self.params = {**remote.request_fields(self.overrides), **self.thinking}

    def handle(self, text: str) -> bool:
        """As BaseChat's, but a first turn that cannot reach the server or finds no such model
        ends the chat with that error's exit code, as a model that fails to load does."""
        if self.last is None and text.strip() and not text.startswith("/"):
            try:
                self._stream(self.conversation.send(text, self.params))
            except (NetworkError, ModelNotFoundError):
                raise
            except InferError as e:
                note(f"error: {e}")
            return True
        return super().handle(text)

    @property
    def model_name(self) -> str:
        return str(self.conversation.model)

    def _tokens(self) -> None:
        if self.last is None:
            say("no reply yet (the server counts the tokens of each turn)")
            return
        say(f"{self._context_used()} tokens in the server's context after the last turn")

    def _show(self) -> None:
        say(f"model: {self.model_name} (loaded in the infer server at {self.where.shown})\n"
            f"system: {self.conversation.system or '(none)'}\n"
            "context and template: the server's")

    def _context_used(self) -> int:
        if self.last is None:
            return 0
        return int(self.last.usage.prompt_tokens + self.last.usage.completion_tokens)

    def _model(self, arg: str) -> None:
        if not arg:
            say(f"model: {self.model_name}")
            return
        self.conversation.model = arg  # the server loads it for the next turn (or says it cannot)
        note(f"now chatting with {arg}; the next turn reads the conversation again")

    def save(self, name: str) -> None:
        """The messages and the parameters set; the KV cache stays in the server."""
        write_session(name, {"fingerprint": None, "messages": messages_to_json(self.conversation.messages),
                             "tokens": [],
                             "params": dict(self.overrides), "thinking": self.prompt_settings}, None)
        note(f"saved session {name!r} (messages and parameters; the KV cache is the server's)")

    def load(self, name: str) -> None:
        """A saved conversation and its parameters (those a server takes); a KV state saved
        with it stays on disk, for a chat with the model loaded here."""
        meta, _kv = read_session(name)
        overrides = {}
        for key, value in saved_params(meta).items():
            with contextlib.suppress(UsageError):  # (a setting a server cannot take)
                remote.request_fields({key: value})
                overrides[key] = value
        self.conversation.messages = messages_from_json(meta["messages"])
        self.overrides = overrides
        self.restore_thinking(meta)
        self.params = {**remote.request_fields(overrides), **self.thinking}
        note(f"loaded session {name!r}")

    def _set(self, arg: str) -> None:
        if not arg:
            say(list_overrides(self.overrides))
            return
        setting = parse_setting(arg, hint="",
                                no_ctx="ctx belongs where the model is loaded: give -c to `infer serve`")
        if setting.keys() <= set(PROMPT_SETTINGS):
            self.set_prompt(setting)
            return
        overrides = {**self.overrides, **setting}
        # (a setting the server cannot take fails here)
        self.params = {**remote.request_fields(overrides), **self.thinking}
        self.overrides = overrides
        (key,) = setting
        note(f"{key} = {overrides[key]!r}")
