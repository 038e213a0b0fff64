"""`infer run MODEL [PROMPT]`: the command as Typer sees it; what it does is cli/one_shot.py."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from infer.cli import options as o
from infer.cli.errors import shielded


@o.model_command(
    ("model", Annotated[str | None, typer.Argument(
        help="A .gguf file, an alias from models.toml, or a Hub repo owner/repo[:QUANT]. "
             "With --continue, a single argument is the PROMPT and the model is the conversation's.",
        show_default=False)], None),
    ("prompt", Annotated[str | None, typer.Argument(
        help="The prompt. Piped stdin comes first; '-' means stdin alone.", show_default=False)], None),
    ("system", Annotated[str | None, typer.Option("-s", "--system", help="System prompt.")], None),
    ("raw", Annotated[bool, typer.Option("--raw", help="No chat template: the prompt is sent as is.")],
     False),
    o.CHAT_TEMPLATE_FILE,
    ("show_prompt", Annotated[bool, typer.Option(
        "--show-prompt", help="Print the rendered prompt and exit.")], False),
    ("continue_last", Annotated[bool, typer.Option(
        "-C", "--continue", help="Continue the last conversation: its messages are the history.")],
     False),
    ("conversation_id", Annotated[str | None, typer.Option(
        "--conversation", help="Continue this conversation (its id is shown by -v and --json).")], None),
    o.NO_CACHE,
    ("json_output", Annotated[bool, typer.Option(
        "--json", help="One JSON object with text, usage and timings.", rich_help_panel=o.OUTPUT)],
     False),
    o.SERVER,
    *o.thinking_options(),
    *o.tool_options(),
    *o.media_options(),
)
def run(ctx: typer.Context, **flags: Any) -> None:
    """Generate a reply to PROMPT and stream it to stdout."""
    from infer.cli.one_shot import execute

    shielded(execute, ctx.params)
