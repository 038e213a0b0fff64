"""What a chat does with each line typed, with the model loaded here (cli/chat_local.py) or
in a server (cli/chat_remote.py): a message is a turn whose reply streams; a line that
starts with / is a slash command."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

from infer.cli.chat_input import keys_held
from infer.cli.chat_output import note, say
from infer.runtime.errors import InferError, UsageError

HELP = """commands:
  /help              this list
  /exit, /bye        leave (Ctrl-D too)
  /clear             new conversation, same system prompt
  /system TEXT       set the system prompt
  /set PARAM VALUE   change a sampling parameter (ctx, think, reasoning-budget too); /set alone lists them
  /think LEVEL       a thinking model: on, off, low, medium, high, or default (the template's)
  /undo              remove the last exchange
  /retry             generate the last reply again
  /stats             tokens, cached tokens, last turn's speed and time to first token
  /tokens            how full the context is
  /show              model, template and parameters
  /model MODEL       switch to another model, keeping the conversation
  /save NAME         save the conversation and its KV cache
  /load NAME         continue a saved conversation
  /image PATH        attach an image to the next message (a message that is only an image's path does too)
  /audio PATH        attach an audio file to the next message"""


class BaseChat:
    """The turns and slash commands both chats share. Each chat has a conversation (send,
    retry, clear, undo, set_system), its sampling parameters, and the commands that differ
    where the model is loaded: model_name, _tokens, _show, _context_used, _model, _set,
    save and load."""

    conversation: Any
    params: Any
    reply: Callable[[], Any]  # a writer for the next reply
    thoughts: Callable[[], Any]  # a display for the next reply's reasoning (cli/thinking_display.py)
    prompt_settings: dict[str, Any]  # think, chat_template_kwargs, reasoning_budget, as their flags
    last: Any  # the last turn's Completion (None before the first)

    def __enter__(self) -> BaseChat:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    @property
    def model_name(self) -> str:
        raise NotImplementedError

    def handle(self, text: str) -> bool:
        """One line of input; False means leave."""
        if not text.strip():
            return True
        path = _media_path(text)  # (an absolute path starts with "/" too)
        if text.startswith("/") and path is None:
            return self.command(text)
        try:
            media, text = self._media_for(text, path)
            self._stream(self.conversation.send(text, self.params, media) if media
                         else self.conversation.send(text, self.params))
        except InferError as e:  # this turn fails; the chat goes on
            note(f"error: {e}")
        return True

    def _attach(self, kind: str, path: str) -> None:
        """/image PATH, /audio PATH: a medium for the next message."""
        from infer.runtime.media import read_medium

        if not path:
            raise UsageError(f"/{kind} needs a file's path")
        medium = read_medium(path.strip("'\""), kind)
        self.__dict__.setdefault("pending_media", []).append(medium)
        note(f"{medium.name} goes with the next message")

    def _media_for(self, text: str, path: str | None) -> tuple[tuple[Any, ...], str]:
        """The media the next message takes (attached before it, or the message itself when it is
        only the `path` of an image or audio file: then it has no text), and its text."""
        from infer.runtime.media import read_medium

        media = tuple(self.__dict__.pop("pending_media", ()))
        if path is not None:
            return (*media, read_medium(path)), ""
        return media, text

    def command(self, text: str) -> bool:
        name, _, arg = text.strip().partition(" ")
        arg = arg.strip()
        try:
            if name in ("/exit", "/bye"):
                return False
            if name == "/help":
                say(HELP)
            elif name == "/clear":
                self.conversation.clear()
                note("new conversation")
            elif name == "/system":
                self.conversation.set_system(arg or None)
                note("system prompt set" if arg else "system prompt removed")
            elif name == "/set":
                self._set(arg)
            elif name == "/think":
                self._think(arg)
            elif name == "/undo":
                note("removed the last exchange" if self.conversation.undo() else "nothing to undo")
            elif name == "/retry":
                self._stream(self.conversation.retry(self.params))
            elif name == "/stats":
                self._stats()
            elif name == "/tokens":
                self._tokens()
            elif name == "/save":
                self.save(arg)
            elif name == "/load":
                self.load(arg)
            elif name == "/model":
                self._model(arg)
            elif name == "/show":
                self._show()
            elif name in ("/image", "/audio"):
                self._attach(name[1:], arg)
            else:
                note(f"unknown command {name} (/help lists them)")
        except InferError as e:
            note(f"error: {e}")
        return True

    def _think(self, arg: str) -> None:
        if not arg:
            say(f"think = {self.prompt_settings.get('think') or 'default (the template’s)'}")
            return
        self.set_prompt({"think": None if arg.lower() == "default" else arg})

    def set_prompt(self, setting: dict[str, Any]) -> None:
        """A thinking setting (/think, /set think, /set reasoning-budget), checked as its flag is."""
        from infer.cli.flags import thinking_request

        settings = {**self.prompt_settings, **setting}
        request = thinking_request(settings)
        self.prompt_settings = settings
        self._apply_thinking(request)
        (key,) = setting
        note(f"{key} = {settings[key]!r}")

    def restore_thinking(self, meta: dict[str, Any]) -> None:
        """A saved chat's thinking settings (/think, /set think|reasoning-budget|
        chat-template-kwargs), in use from the next turn; ones that no longer check are said."""
        from infer.cli.chat_settings import PROMPT_SETTINGS
        from infer.cli.flags import thinking_request

        saved = meta.get("thinking")
        if not isinstance(saved, dict):
            return  # (saved before the settings were kept: the current ones stay)
        settings = {name: saved.get(name) for name in PROMPT_SETTINGS}
        try:
            request = thinking_request(settings)
        except InferError as e:
            note(f"the saved thinking settings are not applied: {e}")
            return
        self.prompt_settings = settings
        self._apply_thinking(request)

    def _apply_thinking(self, request: Any) -> None:
        """Use these thinking settings (a runtime.thinking.ThinkingRequest) from the next turn."""
        raise NotImplementedError

    def _tokens(self) -> None:
        raise NotImplementedError

    def _show(self) -> None:
        raise NotImplementedError

    def _context_used(self) -> int:
        raise NotImplementedError

    def _model(self, arg: str) -> None:
        raise NotImplementedError

    def _set(self, arg: str) -> None:
        raise NotImplementedError

    def save(self, name: str) -> None:
        raise NotImplementedError

    def load(self, name: str) -> None:
        raise NotImplementedError

    def _stats(self) -> None:
        from infer.cli.speculation import describe

        if self.last is None:
            say("no reply yet")
            return
        c = self.last
        say(f"context: {self._context_used()} tokens; last turn: {c.usage.prompt_tokens} "
            f"prompt tokens ({c.usage.cached_tokens} cached, {c.timings.prefill_tokens} prefilled), "
            f"{c.usage.completion_tokens} generated; time to first token {c.timings.ttft_ms:.0f} ms; "
            f"prefill {c.timings.prefill_tps:.1f} tokens/s; "
            f"decode {c.timings.decode_tps(c.usage.completion_tokens):.1f} tokens/s; "
            f"{describe(c.usage, c.timings)}")

    def _stream(self, events: Iterator[Any]) -> None:
        from infer.runtime.messages import Dropped
        from infer.runtime.results import Completion, Piece, Thought

        reply = None
        thoughts = self.thoughts()
        try:
            with keys_held():
                for event in events:
                    if isinstance(event, Thought):
                        thoughts.write(event.text)
                    elif isinstance(event, Piece):
                        if reply is None:
                            thoughts.end()
                            reply = self.reply()
                        reply.write(event.text)
                    elif isinstance(event, Dropped):
                        note(f"context full: dropped the {event.exchanges} oldest exchange(s)")
                    elif isinstance(event, Completion):
                        self.last = event
        except KeyboardInterrupt:
            thoughts.end()
            if not sys.stdin.isatty():
                raise
            if reply:
                reply.close()
                reply = None
            note("(stopped)")
        finally:
            thoughts.end()
            if reply:
                reply.close()


def _media_path(text: str) -> str | None:
    """`text` as the path of an image or audio file, if it is only that (quotes around it allowed)."""
    from pathlib import Path

    from infer.runtime.media import sniff

    candidate = text.strip().strip("'\"")
    if not candidate or "\n" in candidate or len(candidate) > 4096:
        return None
    path = Path(candidate).expanduser()
    try:
        with path.open("rb") as f:
            return str(path) if path.is_file() and sniff(f.read(16)) is not None else None
    except OSError:
        return None
