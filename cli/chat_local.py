"""`infer chat` with the model loaded here: the model opened for the chat, and the chat's
state (conversation, sampling parameters) that the slash commands act on."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from infer.cli.chat_commands import BaseChat
from infer.cli.chat_files import (
    messages_from_json,
    messages_to_json,
    params_dict,
    read_session,
    saved_params,
    write_session,
)
from infer.cli.chat_output import note, say
from infer.cli.chat_settings import PROMPT_SETTINGS, list_settings, parse_setting
from infer.cli.flags import context_params, load_plan, prompt_flags, read_text_file, resolve, thinking_request
from infer.cli.placement import report
from infer.cli.render import reply_writer
from infer.cli.thinking_display import thinking_display


def open_chat(flags: Mapping[str, Any], overrides: dict[str, Any]) -> ChatState:
    """The chat with flags["model"] loaded here; its system prompt is the flag's, else the
    one its catalog entry gives."""
    loaded = _Loaded.open(flags, flags["model"])
    system = flags["system"]
    if system is None and loaded.entry:
        system = loaded.entry.system
    try:
        return ChatState(loaded, flags, overrides, system=system)
    except BaseException:
        loaded.session.close()
        raise


def _projector(flags: Mapping[str, Any], loaded: _Loaded) -> Any:
    """The model's projector (--mmproj's, or its repository's), None if it has none."""
    from infer.cli.media import open_projector, projector_path

    path = projector_path(flags, loaded)
    return open_projector(path, loaded.session) if path is not None else None


class _Loaded:
    """A model opened for the chat: its session, name, catalog entry and sampling defaults."""

    def __init__(self, session: Any, resolved: Any) -> None:
        from infer.runtime.loading import sampling_defaults

        self.session = session
        self.reference = resolved.reference
        self.entry = resolved.entry
        self.mmproj = resolved.mmproj  # the projector that came with it from its repository
        self.defaults = sampling_defaults(session.model, resolved)

    @classmethod
    def open(cls, flags: Mapping[str, Any], model: str) -> _Loaded:
        return cls.load(flags, resolve({**flags, "model": model}))

    @classmethod
    def load(cls, flags: Mapping[str, Any], resolved: Any) -> _Loaded:
        """Open a resolved model with the context the flags ask for."""
        from infer.cli.speculation import attach

        plan = load_plan(flags, resolved)
        placed = plan.placed
        session = plan.open_session()
        resolved.record_use()
        try:
            attach(flags, session, placed)
        except BaseException:
            session.close()
            raise
        if flags.get("verbose"):
            report(placed, session.model)
        return cls(session, resolved)


class ChatState(BaseChat):
    """The conversation, its sampling parameters, and what the slash commands act on."""

    def __init__(self, loaded: _Loaded, flags: Mapping[str, Any], overrides: dict[str, Any], *,
                 system: str | None) -> None:
        from infer.cli.prompt_cache import open_cache
        from infer.runtime.sampling import SamplingParams

        self.cache = None if flags["no_cache"] else open_cache()
        self.flags = flags
        self.template = None  # --chat-template-file's, else the model's own
        if flags.get("chat_template_file") is not None:
            self.template = read_text_file(flags["chat_template_file"], "chat template file")
        self.prompt_settings = prompt_flags(flags)
        self.thinking = thinking_request(self.prompt_settings)
        self.thoughts = partial(thinking_display, flags)
        self.projector = _projector(flags, loaded)
        self.conversation = self._conversation(loaded, system)
        self.loaded = loaded
        self.overrides = overrides  # what the user set (flags, /set, /load): kept across /model
        self.params = SamplingParams.resolve(loaded.defaults, overrides)
        self.reply = partial(reply_writer, flags["plain"])
        self.last: Any = None
        self._say_think_note()

    def _conversation(self, loaded: _Loaded, system: str | None = None) -> Any:
        """A new conversation on `loaded`'s session, with the chat's policy and prompt cache."""
        from infer.runtime.conversation import Conversation

        conversation = Conversation(loaded.session, system=system, template=self.template,
                                    context_policy=self.flags["context_policy"], prompt_cache=self.cache,
                                    cache_name=loaded.reference, projector=self.projector)
        conversation.thinking = self.thinking
        return conversation

    def _apply_thinking(self, request: Any) -> None:
        self.thinking = self.conversation.thinking = request
        self._say_think_note()

    def _say_think_note(self) -> None:
        """Under -v: what the think level cannot set in this model's template (as infer run says)."""
        if not self.flags.get("verbose") or self.thinking.think is None:
            return
        from infer.runtime.prompt import template_variables

        model = self.loaded.session.model
        _, said = template_variables(model, template=self.template, think=self.thinking.think)
        if said is not None:
            note(said)

    def __exit__(self, *exc: object) -> None:
        if self.cache is not None:
            self.cache.flush()  # a system prompt's state still being written
        if self.projector is not None:
            self.projector.close()
        self.loaded.session.close()

    @property
    def model_name(self) -> str:
        return self.loaded.reference

    def _tokens(self) -> None:
        used, n_ctx = len(self.conversation.tokens()), self.conversation.session.n_ctx
        say(f"{used} of {n_ctx} tokens in context ({used / n_ctx:.0%})")

    def _show(self) -> None:
        model = self.conversation.session.model
        say(f"model: {self.model_name} ({model.description()}, {model.n_params / 1e6:.0f}M params)\n"
            f"context: {self.conversation.session.n_ctx} tokens\n"
            f"system: {self.conversation.system or '(none)'}\n"
            f"template: {(model.chat_template() or 'chatml (built-in)')[:200]}")

    def _context_used(self) -> int:
        """The tokens the conversation takes in the context now."""
        return len(self.conversation.tokens())

    def _model(self, arg: str) -> None:
        if not arg:
            say(f"model: {self.model_name}")
            return
        self.switch(arg)
        note(f"now chatting with {self.model_name}; the next turn reads the conversation again")

    def save(self, name: str) -> None:
        """Messages, parameters and the KV state, written atomically under INFER_HOME/sessions."""
        tokens, kv = self.conversation.session.save_state()
        write_session(name, {"fingerprint": self.conversation.session.fingerprint(),
                             "messages": messages_to_json(self.conversation.messages), "tokens": tokens,
                             "params": params_dict(self.params), "thinking": self.prompt_settings}, kv)
        note(f"saved session {name!r} ({len(tokens)} tokens in the cache)")

    def load(self, name: str) -> None:
        """Restore a saved conversation; its KV state too when it fits this model and context."""
        import hashlib

        meta, kv = read_session(name)
        session = self.conversation.session
        self.conversation.messages = messages_from_json(meta["messages"])
        self._set_params(saved_params(meta))
        self.restore_thinking(meta)
        same = (kv is not None and meta.get("fingerprint") == session.fingerprint()
                and hashlib.sha256(kv).hexdigest() == meta.get("kv_sha256"))
        if same and kv is not None and session.restore_state(list(meta["tokens"]), kv):
            note(f"loaded session {name!r}")
        else:
            note(f"loaded session {name!r}; it was saved with another model or context "
                 "settings (or through a server), so the next turn reads the whole conversation again")

    def switch(self, model: str, **flag_changes: Any) -> None:
        """Another model (or the same one with other context flags), keeping the conversation.

        The old model is closed before the new one loads, so that both are never in
        memory at once; if the new one fails to load, the old one is opened again.
        """
        flags = {**self.flags, **flag_changes}
        context_params(flags)  # bad values and unknown models fail before anything is closed
        resolved = resolve({**flags, "model": model})
        old = self.loaded
        if self.projector is not None:  # (it reads into the old model)
            self.projector.close()
            self.projector = None
        old.session.close()
        try:
            loaded = _Loaded.load(flags, resolved)
        except BaseException:
            self.loaded = _Loaded.open(self.flags, old.reference)
            self.conversation.session = self.loaded.session
            raise
        # (--mmproj is the first model's; another model has its repository's, if any)
        self.projector = _projector(flags if model == old.reference else {**flags, "mmproj": None}, loaded)
        conversation = self._conversation(loaded)
        conversation.messages = self.conversation.messages
        self.conversation, self.loaded, self.flags = conversation, loaded, flags
        self._set_params(self.overrides)

    def _set_params(self, overrides: dict[str, Any]) -> None:
        from infer.runtime.sampling import SamplingParams

        self.params = SamplingParams.resolve(self.loaded.defaults, overrides)
        self.overrides = overrides

    def _set(self, arg: str) -> None:
        if not arg:
            say(list_settings(self.params, self.conversation.session.n_ctx, self.prompt_settings))
            return
        setting = parse_setting(arg)
        if setting.keys() <= set(PROMPT_SETTINGS):
            self.set_prompt(setting)
            return
        if "ctx" in setting:
            self.switch(self.loaded.reference, ctx_size=setting["ctx"])
            note(f"ctx = {self.conversation.session.n_ctx}; the next turn reads the conversation again")
            return
        self._set_params({**self.overrides, **setting})
        (key,) = setting
        note(f"{key} = {getattr(self.params, key)!r}")
