"""`infer chat MODEL`: an interactive chat whose turns reuse the KV cache.

On a terminal it is a line editor (prompt_toolkit: history per model, Ctrl-R,
multi-line input with triple quotes or Alt-Enter). With piped input it reads one
message per line (or per triple-quoted block) and prints each reply: scriptable.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping
from dataclasses import fields
from functools import partial
from typing import Annotated, Any

import typer

from infer.cli import options as o
from infer.cli import remote
from infer.cli.errors import shielded
from infer.cli.flags import (
    context_params,
    log_to_stderr,
    model_context_params,
    model_sampling_defaults,
    record_run,
    resolve,
    sampling_overrides,
    spec_params,
)
from infer.cli.placement import explain, place, report
from infer.cli.render import reply_writer
from infer.runtime.errors import InferError, UsageError

HELP = """commands:
  /help              this list
  /exit, /bye        leave (Ctrl-D too)
  /clear             new conversation, same system prompt
  /system TEXT       set the system prompt
  /set PARAM VALUE   change a sampling parameter (ctx too); /set alone lists them
  /undo              remove the last exchange
  /retry             generate the last reply again
  /stats             tokens, cached tokens, last turn's speed and time to first token
  /tokens            how full the context is
  /show              model, template and parameters
  /model MODEL       switch to another model, keeping the conversation
  /save NAME         save the conversation and its KV cache
  /load NAME         continue a saved conversation"""


@o.model_command(
    ("model", Annotated[str, typer.Argument(
        help="A .gguf file, an alias from models.toml, or a Hub repo owner/repo[:QUANT].",
        show_default=False)], ...),
    ("system", Annotated[str | None, typer.Option("-s", "--system", help="System prompt.")], None),
    ("context_policy", Annotated[str, typer.Option(
        "--context-policy", help="When the context is full: drop-oldest (exchanges) or error.")],
     "drop-oldest"),
    ("session_name", Annotated[str | None, typer.Option(
        "--session", help="Continue a conversation saved with /save NAME.")], None),
    ("plain", Annotated[bool, typer.Option(
        "--plain", help="Print replies as they come, without rendering Markdown.",
        rich_help_panel=o.OUTPUT)], False),
    o.NO_CACHE,
    o.SERVER,
)
def chat(ctx: typer.Context, **flags: Any) -> None:
    """Chat with a model; each turn prefills only the new message."""
    shielded(_chat, ctx.params)


def _chat(flags: Mapping[str, Any]) -> None:
    from infer.runtime.sampling import SamplingParams

    if flags["verbose"]:
        log_to_stderr()
    overrides = sampling_overrides(flags)
    where = remote.address(flags)
    if where is not None:  # the model is loaded there
        _chat_through(flags, where, overrides)
        return
    SamplingParams.resolve({}, overrides)  # bad values fail before the model loads
    context_params(flags)
    spec_params(flags)
    if flags["explain"]:
        resolved = resolve(flags)
        explain(place(resolved.path, model_context_params(flags, resolved.entry)), resolved.reference)
        return
    loaded = _Loaded.open(flags, flags["model"])
    system = flags["system"]
    if system is None and loaded.entry:
        system = loaded.entry.system
    try:
        state = ChatState(loaded, flags, overrides, system=system)
    except BaseException:
        loaded.session.close()
        raise
    with state:
        if flags["session_name"]:
            state.load(flags["session_name"])
        _converse(state)


def _chat_through(flags: Mapping[str, Any], where: Any, overrides: dict[str, Any]) -> None:
    """The chat with the model loaded in the server at `where`."""
    from infer.cli.chat_remote import RemoteChat

    remote.refuse_local_flags(flags, o.defaults(chat))
    remote.check(where)  # unreachable, or not this user's: said now, before anything is typed
    with RemoteChat(flags, where, overrides) as state:
        if flags["session_name"]:
            state.load(flags["session_name"])
        _converse(state)


def _converse(state: ChatState) -> None:
    """Read messages (a line editor on a terminal, else the piped lines) until the chat ends."""
    messages = _terminal_messages(state.model_name) if sys.stdin.isatty() else _piped_messages()
    for text in messages:
        if not state.handle(text):
            break


class _Loaded:
    """A model opened for the chat: its session, name, catalog entry and sampling defaults."""

    def __init__(self, session: Any, reference: str, entry: Any) -> None:
        self.session = session
        self.reference = reference
        self.entry = entry
        self.defaults = model_sampling_defaults(session.model, entry)

    @classmethod
    def open(cls, flags: Mapping[str, Any], model: str) -> _Loaded:
        return cls.load(flags, resolve({**flags, "model": model}))

    @classmethod
    def load(cls, flags: Mapping[str, Any], resolved: Any) -> _Loaded:
        """Open a resolved model with the context the flags ask for."""
        from infer.runtime.session import Session

        placed = place(resolved.path, model_context_params(flags, resolved.entry))
        from infer.cli.speculation import attach

        session = Session.open(resolved.path, placed.params, devices=placed.handles)
        record_run(resolved)
        try:
            attach(flags, session, placed)
        except BaseException:
            session.close()
            raise
        if flags.get("verbose"):
            report(placed, session.model)
        return cls(session, resolved.reference, resolved.entry)


class ChatState:
    """The conversation, its sampling parameters, and what the slash commands act on."""

    def __init__(self, loaded: _Loaded, flags: Mapping[str, Any], overrides: dict[str, Any], *,
                 system: str | None) -> None:
        from infer.cli.prompt_cache import open_cache
        from infer.runtime.sampling import SamplingParams

        self.cache = None if flags["no_cache"] else open_cache()
        self.flags = flags
        self.conversation = self._conversation(loaded, system)
        self.loaded = loaded
        self.overrides = overrides  # what the user set (flags, /set, /load): kept across /model
        self.params = SamplingParams.resolve(loaded.defaults, overrides)
        self.reply = partial(reply_writer, flags["plain"])
        self.last: Any = None

    def _conversation(self, loaded: _Loaded, system: str | None = None) -> Any:
        """A new conversation on `loaded`'s session, with the chat's policy and prompt cache."""
        from infer.runtime.conversation import Conversation

        return Conversation(loaded.session, system=system, context_policy=self.flags["context_policy"],
                            prompt_cache=self.cache, cache_name=loaded.reference)

    def __enter__(self) -> ChatState:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.cache is not None:
            self.cache.flush()  # a system prompt's state still being written
        self.loaded.session.close()

    @property
    def model_name(self) -> str:
        return self.loaded.reference

    def handle(self, text: str) -> bool:
        """One line of input; False means leave."""
        if not text.strip():
            return True
        if text.startswith("/"):
            return self.command(text)
        try:
            self._stream(self.conversation.send(text, self.params))
        except InferError as e:  # this turn fails; the chat goes on
            _note(f"error: {e}")
        return True

    def command(self, text: str) -> bool:
        name, _, arg = text.strip().partition(" ")
        arg = arg.strip()
        try:
            if name in ("/exit", "/bye"):
                return False
            if name == "/help":
                _say(HELP)
            elif name == "/clear":
                self.conversation.clear()
                _note("new conversation")
            elif name == "/system":
                self.conversation.set_system(arg or None)
                _note("system prompt set" if arg else "system prompt removed")
            elif name == "/set":
                self._set(arg)
            elif name == "/undo":
                _note("removed the last exchange" if self.conversation.undo() else "nothing to undo")
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
            else:
                _note(f"unknown command {name} (/help lists them)")
        except InferError as e:
            _note(f"error: {e}")
        return True

    def _tokens(self) -> None:
        used, n_ctx = len(self.conversation.tokens()), self.conversation.session.n_ctx
        _say(f"{used} of {n_ctx} tokens in context ({used / n_ctx:.0%})")

    def _show(self) -> None:
        model = self.conversation.session.model
        _say(f"model: {self.model_name} ({model.description()}, {model.n_params / 1e6:.0f}M params)\n"
             f"context: {self.conversation.session.n_ctx} tokens\n"
             f"system: {self.conversation.system or '(none)'}\n"
             f"template: {(model.chat_template() or 'chatml (built-in)')[:200]}")

    def _context_used(self) -> int:
        """The tokens the conversation takes in the context now."""
        return len(self.conversation.tokens())

    def _model(self, arg: str) -> None:
        if not arg:
            _say(f"model: {self.model_name}")
            return
        self.switch(arg)
        _note(f"now chatting with {self.model_name}; the next turn reads the conversation again")

    def save(self, name: str) -> None:
        """Messages, parameters and the KV state, written atomically under INFER_HOME/sessions."""
        tokens, kv = self.conversation.session.save_state()
        _write_session(name, {"fingerprint": self.conversation.session.fingerprint(),
                              "messages": self.conversation.messages, "tokens": tokens,
                              "params": _params_dict(self.params)}, kv)
        _note(f"saved session {name!r} ({len(tokens)} tokens in the cache)")

    def load(self, name: str) -> None:
        """Restore a saved conversation; its KV state too when it fits this model and context."""
        import hashlib

        meta, kv = _read_session(name)
        session = self.conversation.session
        self.conversation.messages = list(meta["messages"])
        self._set_params({k: _from_json(k, v) for k, v in meta["params"].items() if k in _param_names()})
        same = (kv is not None and meta.get("fingerprint") == session.fingerprint()
                and hashlib.sha256(kv).hexdigest() == meta.get("kv_sha256"))
        if same and kv is not None and session.restore_state(list(meta["tokens"]), kv):
            _note(f"loaded session {name!r}")
        else:
            _note(f"loaded session {name!r}; it was saved with another model or context "
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
        old.session.close()
        try:
            loaded = _Loaded.load(flags, resolved)
        except BaseException:
            self.loaded = _Loaded.open(self.flags, old.reference)
            self.conversation.session = self.loaded.session
            raise
        conversation = self._conversation(loaded)
        conversation.messages = self.conversation.messages
        self.conversation, self.loaded, self.flags = conversation, loaded, flags
        self._set_params(self.overrides)

    def _set_params(self, overrides: dict[str, Any]) -> None:
        from infer.runtime.sampling import SamplingParams

        self.params = SamplingParams.resolve(self.loaded.defaults, overrides)
        self.overrides = overrides

    def _set(self, arg: str) -> None:
        names = _param_names()
        if not arg:
            _say("\n".join([f"{n} = {getattr(self.params, n)!r}" for n in names]
                           + [f"ctx = {self.conversation.session.n_ctx}"]))
            return
        key, _, value = arg.partition(" ")
        value = value.strip()
        key = _PARAM_ALIASES.get(key, key.replace("-", "_"))
        if key == "ctx":
            n_ctx = _parse_value("int", "ctx", value)
            self.switch(self.loaded.reference, ctx_size=n_ctx)
            _note(f"ctx = {self.conversation.session.n_ctx}; the next turn reads the conversation again")
            return
        if key not in names:
            raise UsageError(f"unknown parameter {key!r} (/set alone lists them)")
        self._set_params({**self.overrides, key: _parse_value(_param_types()[key], key, value)})
        _note(f"{key} = {getattr(self.params, key)!r}")

    def _stats(self) -> None:
        from infer.cli.speculation import describe

        if self.last is None:
            _say("no reply yet")
            return
        c = self.last
        _say(f"context: {self._context_used()} tokens; last turn: {c.usage.prompt_tokens} "
             f"prompt tokens ({c.usage.cached_tokens} cached, {c.timings.prefill_tokens} prefilled), "
             f"{c.usage.completion_tokens} generated; time to first token {c.timings.ttft_ms:.0f} ms; "
             f"prefill {c.timings.prefill_tps:.1f} tokens/s; "
             f"decode {c.timings.decode_tps(c.usage.completion_tokens):.1f} tokens/s; "
             f"{describe(c.usage, c.timings)}")

    def _stream(self, events: Iterator[Any]) -> None:
        from infer.runtime.messages import Dropped
        from infer.runtime.results import Completion, Piece

        reply = None
        try:
            with _keys_held():
                for event in events:
                    if isinstance(event, Piece):
                        reply = reply or self.reply()
                        reply.write(event.text)
                    elif isinstance(event, Dropped):
                        _note(f"context full: dropped the {event.exchanges} oldest exchange(s)")
                    elif isinstance(event, Completion):
                        self.last = event
        except KeyboardInterrupt:
            if not sys.stdin.isatty():
                raise
            if reply:
                reply.close()
                reply = None
            _note("(stopped)")
        finally:
            if reply:
                reply.close()


@contextlib.contextmanager
def _keys_held() -> Iterator[None]:
    """While a reply streams on a terminal, keys typed are not echoed (an echoed Enter
    scrolls the screen under the reply being redrawn in place, which then leaves copies of
    itself) and not lost: they wait in the terminal's queue, and the next prompt reads them
    (type-ahead, Enter included). Ctrl-C still stops the reply."""
    if not sys.stdin.isatty():
        yield
        return
    import termios

    fd = sys.stdin.fileno()
    try:
        saved = termios.tcgetattr(fd)
    except termios.error:
        yield
        return
    held = list(saved)
    held[3] = saved[3] & ~(termios.ECHO | termios.ICANON)  # (ISIG stays: Ctrl-C is a signal)
    held[6] = list(saved[6])
    held[6][termios.VMIN], held[6][termios.VTIME] = 1, 0
    termios.tcsetattr(fd, termios.TCSANOW, held)  # TCSANOW: what was typed stays queued
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, saved)


_PARAM_ALIASES = {"temp": "temperature", "max-tokens": "max_tokens", "num_ctx": "ctx", "ctx-size": "ctx",
                  "ctx_size": "ctx"}


def _param_names() -> list[str]:
    from infer.runtime.sampling import SamplingParams

    return [f.name for f in fields(SamplingParams) if not f.name.startswith("_")]


def _param_types() -> dict[str, str]:
    """Each sampling parameter's declared type, as written in SamplingParams."""
    from infer.runtime.sampling import SamplingParams

    return {f.name: str(f.type) for f in fields(SamplingParams)}


def _parse_value(kind: str, key: str, value: str) -> Any:
    """A /set value, read by the parameter's declared type ("none" clears an optional one)."""
    from infer.runtime.sampling import parse_logit_bias

    if kind.endswith("| None") and value.lower() in ("", "none"):
        return None
    kind = kind.removesuffix(" | None")
    parsers: dict[str, Any] = {
        "int": int, "float": float, "str": str,
        "bool": lambda v: {"1": True, "true": True, "on": True, "yes": True,
                           "0": False, "false": False, "off": False, "no": False}[v.lower()],
        "tuple[str, ...]": lambda v: (v,) if v else (),
        "tuple[tuple[int, float], ...]": lambda v: tuple(parse_logit_bias(x) for x in v.split()),
    }
    try:
        return parsers[kind](value)
    except (ValueError, KeyError):
        what = {"int": "a whole number", "float": "a number", "bool": "on or off"}.get(kind, "a value")
        raise UsageError(f"{key} needs {what}, not {value!r}") from None


def _from_json(key: str, value: Any) -> Any:
    """A saved parameter back in its SamplingParams form (JSON has lists, not tuples)."""
    if key == "logit_bias":
        return tuple(map(tuple, value))
    return tuple(value) if isinstance(value, list) else value


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _note(text: str) -> None:
    """A dim line on stderr (plain when it is not a terminal)."""
    if sys.stderr.isatty():
        text = f"\033[2m{text}\033[0m"
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def _piped_messages() -> Iterator[str]:
    """One message per line, or per block between lines of three double quotes."""
    block: list[str] | None = None
    for raw in sys.stdin:
        line = raw.rstrip("\n")
        if block is not None:
            if line.strip() == '"""':
                yield "\n".join(block)
                block = None
            else:
                block.append(line)
        elif line.strip() == '"""':
            block = []
        elif line.startswith('"""'):
            block = [line[3:]]
        else:
            yield line
    if block:
        yield "\n".join(block)


def _terminal_messages(model_name: str) -> Iterator[str]:
    """Lines from a real line editor, with history per model in infer's home folder."""
    import re

    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory
    from prompt_toolkit.key_binding import KeyBindings

    from infer.quant.paths import infer_home

    history_dir = infer_home() / "history"
    history_dir.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model_name)[:100]
    keys = KeyBindings()

    @keys.add("escape", "enter")
    def _newline(event: Any) -> None:
        event.current_buffer.insert_text("\n")

    session: Any = PromptSession(history=FileHistory(str(history_dir / f"{safe}.txt")),
                                 key_bindings=keys)
    _note("/help for commands, Ctrl-D to leave; \"\"\" or Alt-Enter for several lines")
    while True:
        try:
            text = session.prompt(">>> ")
        except KeyboardInterrupt:
            _note("(Ctrl-D or /exit to leave)")
            continue
        except EOFError:
            return
        if text.strip() == '"""' or (text.startswith('"""') and not text.rstrip().endswith('"""', 3)):
            lines = [text.strip()[3:]] if text.strip() != '"""' else []
            while True:
                try:
                    more = session.prompt("... ")
                except (KeyboardInterrupt, EOFError):
                    break
                if more.rstrip().endswith('"""'):
                    lines.append(more.rstrip()[:-3])
                    break
                lines.append(more)
            text = "\n".join(line for line in lines).strip("\n")
        elif text.startswith('"""') and text.rstrip().endswith('"""'):
            text = text.strip()[3:-3]
        yield text


def _write_session(name: str, meta: dict[str, Any], kv: bytes | None) -> None:
    """A saved chat: session.json (messages, parameters...) and, when there is one, the KV
    state beside it (kv.bin), each written atomically."""
    import hashlib
    import json

    from infer.runtime.atomic import write_atomic

    folder = _session_folder(name)
    meta = {"version": 1, **meta, "kv_sha256": hashlib.sha256(kv).hexdigest() if kv is not None else None}
    if kv is not None:
        write_atomic(folder / "kv.bin", kv)
    else:
        (folder / "kv.bin").unlink(missing_ok=True)  # an older save's state is not this one's
    write_atomic(folder / "session.json", json.dumps(meta).encode())


def _read_session(name: str) -> tuple[dict[str, Any], bytes | None]:
    """A saved chat's session.json and its KV state (None: saved without one)."""
    import json

    folder = _session_folder(name)
    try:
        meta = json.loads((folder / "session.json").read_text(encoding="utf-8"))
        kv = (folder / "kv.bin").read_bytes() if (folder / "kv.bin").exists() else None
    except (OSError, ValueError) as e:
        raise UsageError(f"no saved session {name!r} ({e})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("messages"), list):
        raise UsageError(f"saved session {name!r} is not one infer wrote")
    meta.setdefault("params", {})
    return meta, kv


def _session_folder(name: str) -> Any:
    import re

    from infer.quant.paths import infer_home

    if not name or not re.fullmatch(r"[A-Za-z0-9._-]{1,100}", name) or name.startswith("."):
        raise UsageError("a session name is letters, digits, '.', '_' or '-'")
    return infer_home() / "sessions" / name


def _params_dict(params: Any) -> dict[str, Any]:
    return {f.name: getattr(params, f.name) for f in fields(params) if not f.name.startswith("_")}
