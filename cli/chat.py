"""`infer chat MODEL`: an interactive chat whose turns reuse the KV cache.

On a terminal it is a line editor (prompt_toolkit: history per model, Ctrl-R,
multi-line input with triple quotes or Alt-Enter). With piped input it reads one
message per line (or per triple-quoted block) and prints each reply: scriptable.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Annotated, Any

import typer

from infer.cli import options as o
from infer.cli import remote
from infer.cli.chat_commands import BaseChat
from infer.cli.chat_input import piped_messages, terminal_messages
from infer.cli.chat_local import open_chat
from infer.cli.errors import shielded
from infer.cli.flags import (
    context_params,
    load_plan,
    log_to_stderr,
    resolve,
    sampling_overrides,
    spec_params,
    thinking_request,
)
from infer.cli.placement import explain


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
    o.CHAT_TEMPLATE_FILE,
    *o.thinking_options(),
    o.MMPROJ,
    o.NO_MMPROJ,
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
    thinking_request(flags)
    context_params(flags)
    spec_params(flags)
    if flags["explain"]:
        resolved = resolve(flags)
        explain(load_plan(flags, resolved).placed, resolved.reference)
        return
    with open_chat(flags, overrides) as state:
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


def _converse(state: BaseChat) -> None:
    """Read messages (a line editor on a terminal, else the piped lines) until the chat ends."""
    messages = terminal_messages(state.model_name) if sys.stdin.isatty() else piped_messages()
    for text in messages:
        if not state.handle(text):
            break
