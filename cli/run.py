"""`infer run MODEL [PROMPT]`: one prompt, one answer, streamed to stdout."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from infer.cli import options as o
from infer.cli.errors import shielded
from infer.cli.stdin import combine_prompt
from infer.runtime.errors import UsageError


@o.model_command(
    ("model", Annotated[str, typer.Argument(
        help="A .gguf file, an alias from models.toml, or a Hub repo owner/repo[:QUANT].",
        show_default=False)], ...),
    ("prompt", Annotated[str | None, typer.Argument(
        help="The prompt. Piped stdin comes first; '-' means stdin alone.", show_default=False)], None),
    ("system", Annotated[str | None, typer.Option("-s", "--system", help="System prompt.")], None),
    ("raw", Annotated[bool, typer.Option("--raw", help="No chat template: the prompt is sent as is.")],
     False),
    ("chat_template_file", Annotated[Path | None, typer.Option(
        "--chat-template-file", help="A Jinja chat template to use instead of the model's.")], None),
    ("show_prompt", Annotated[bool, typer.Option(
        "--show-prompt", help="Print the rendered prompt and exit.")], False),
    ("json_output", Annotated[bool, typer.Option(
        "--json", help="One JSON object with text, usage and timings.", rich_help_panel=o.OUTPUT)],
     False),
)
def run(ctx: typer.Context, **flags: Any) -> None:
    """Generate a reply to PROMPT and stream it to stdout."""
    shielded(execute, ctx.params)


def execute(flags: Mapping[str, Any]) -> None:
    from infer.runtime.sampling import SamplingParams, model_sampling_defaults
    from infer.runtime.session import Session

    if flags["verbose"]:
        o.log_to_stderr()
    if flags["raw"] and flags["system"] is not None:
        raise UsageError("--raw sends the prompt as is; it cannot take a -s/--system prompt")
    overrides = o.sampling_overrides(flags)
    SamplingParams.resolve({}, overrides)  # bad values fail before the model loads
    cparams = o.context_params(flags)
    template = None
    if flags["chat_template_file"] is not None:
        template = o.read_text_file(flags["chat_template_file"], "chat template file")
    text = combine_prompt(flags["prompt"], sys.stdin.buffer, sys.stdin.isatty())

    resolved = o.resolve(flags)
    entry = resolved.entry  # an alias's defaults apply unless a flag says otherwise
    if entry and entry.ctx_size and flags["ctx_size"] is None:
        cparams = replace(cparams, n_ctx=entry.ctx_size)
    system = flags["system"]
    if entry and entry.system and system is None and not flags["raw"]:
        system = entry.system
    loaded = Session.open_in_background(resolved.path, cparams)
    # While llama.cpp loads the model: import the template machinery (Jinja).
    from infer.quant.paths import infer_home
    from infer.runtime.prompt import chat_prompt, raw_prompt
    from infer.runtime.template import use_compiled_cache

    use_compiled_cache(infer_home() / "cache" / "templates")

    with loaded() as session:
        if flags["raw"]:
            if not text:
                raise UsageError("the prompt is empty")
            prompt = raw_prompt(session.model, text)
        else:
            messages = [{"role": "user", "content": text}]
            if system is not None:
                messages.insert(0, {"role": "system", "content": system})
            prompt = chat_prompt(session.model, messages, template=template)
        if flags["show_prompt"]:
            _write(prompt.text if prompt.text.endswith("\n") else prompt.text + "\n")
            return
        defaults = model_sampling_defaults(session.model.meta)
        if entry:
            defaults.update(entry.sampling)
        params = SamplingParams.resolve(defaults, overrides)
        completion = _generate(session, prompt.tokens, params, stream=not flags["json_output"])
    if resolved.repo is not None:
        from infer.quant.store import record_use

        record_use(resolved.path)
    if flags["json_output"]:
        _write(json.dumps(result_json(resolved.reference, completion), ensure_ascii=False) + "\n")
    if flags["verbose"]:
        _print_stats(completion)


def _generate(session: Any, tokens: list[int], params: Any, *, stream: bool) -> Any:
    from infer.runtime.session import Completion, Piece

    ends_with_newline = True
    try:
        for event in session.generate(tokens, params):
            if isinstance(event, Piece):
                if stream:
                    _write(event.text)
                    ends_with_newline = event.text.endswith("\n")
            elif isinstance(event, Completion):
                completion = event
    except KeyboardInterrupt:
        if stream and not ends_with_newline:
            _write("\n")
        raise
    if stream and not ends_with_newline:
        _write("\n")
    return completion


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def result_json(model: str, c: Any) -> dict[str, Any]:
    """The --json result: text, why it ended, token counts and timings."""
    t = c.timings
    return {
        "model": model,
        "text": c.text,
        "finish_reason": c.finish_reason,
        "seed": c.seed,
        "usage": {
            "prompt_tokens": c.usage.prompt_tokens,
            "cached_tokens": c.usage.cached_tokens,
            "completion_tokens": c.usage.completion_tokens,
        },
        "timings": {
            "load_ms": round(t.load_ms, 3),
            "prefill_ms": round(t.prefill_ms, 3),
            "decode_ms": round(t.decode_ms, 3),
            "ttft_ms": round(t.ttft_ms, 3),
            "prefill_tokens_per_second": round(t.prefill_tps, 3),
            "decode_tokens_per_second": round(t.decode_tps(c.usage.completion_tokens), 3),
        },
    }


def _print_stats(c: Any) -> None:
    t, u = c.timings, c.usage
    lines = [
        f"finish: {c.finish_reason}    seed: {c.seed}",
        f"prompt: {u.prompt_tokens} tokens ({u.cached_tokens} cached)    "
        f"completion: {u.completion_tokens} tokens",
        f"load: {t.load_ms:.0f} ms    time to first token: {t.ttft_ms:.0f} ms",
        f"prefill: {t.prefill_ms:.0f} ms ({t.prefill_tps:.1f} tokens/s)    "
        f"decode: {t.decode_ms:.0f} ms ({t.decode_tps(u.completion_tokens):.1f} tokens/s)",
    ]
    sys.stderr.write("".join(f"infer: {line}\n" for line in lines))
    sys.stderr.flush()
