"""What `infer run` does with its parsed flags: one prompt, one answer, streamed to
stdout, by the model loaded here or by a running `infer serve`.

Free of Typer: cli/run.py declares the command for Typer, and cli/plain_args.py
calls `execute` directly when the arguments are plain (see there why).
"""

from __future__ import annotations

import json
import sys
import time

from infer.cli.flags import (
    context_params,
    load_plan,
    log_to_stderr,
    prompt_settings,
    read_text_file,
    reasoning_budget,
    resolve,
    sampling_overrides,
    spec_params,
    thinking_request,
)
from infer.cli.stdin import combine_prompt
from infer.runtime.errors import UsageError

TYPE_CHECKING = False  # (typing and collections.abc cost the start-up of every call: cli/main.py)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from infer.cli import remote


def execute(flags: Mapping[str, Any]) -> None:
    from infer.cli import conversations, remote

    if flags["verbose"]:
        log_to_stderr()
    if flags["raw"] and flags["system"] is not None:
        raise UsageError("--raw sends the prompt as is; it cannot take a -s/--system prompt")
    continuing = flags["continue_last"] or flags["conversation_id"] is not None
    if flags["raw"] and continuing:
        raise UsageError("--raw has no conversation to continue")
    overrides = sampling_overrides(flags)
    where = remote.address(flags)
    if where is None:  # (a server checks the values itself)
        from infer.runtime.sampling import SamplingParams

        SamplingParams.resolve({}, overrides)  # bad values fail before the model loads
        context_params(flags)  # bad values fail before the model loads
        spec_params(flags)
    if flags["raw"] and (prompt_settings(flags) != (None, {}) or reasoning_budget(flags) is not None):
        raise UsageError("--raw sends the prompt as is: it takes no --think, --chat-template-kwargs or "
                         "--reasoning-budget")
    tools = None
    if flags.get("tools") is not None or flags.get("tool_choice") is not None:
        from infer.cli.run_tools import tool_request

        tools = tool_request(flags)
    if tools is not None and flags["raw"]:
        raise UsageError("--tools needs the chat template: not with --raw")
    template = None
    if flags["chat_template_file"] is not None:
        template = read_text_file(flags["chat_template_file"], "chat template file")
    model, prompt_arg = flags["model"], flags["prompt"]
    record = conversations.load(flags["conversation_id"]) if continuing else None
    if record is not None and prompt_arg is None:
        model, prompt_arg = record.model, model  # `infer run -C "next question"`
    if model is None:
        raise UsageError("give a MODEL (a .gguf file, an alias, or owner/repo[:QUANT]); "
                         "see 'infer run --help'")
    if where is not None:  # the model is loaded there: send the request, print the same
        from infer.cli.plain_args import defaults

        remote.refuse_local_flags(flags, defaults("run"))
        _execute_remote(flags, where, model, prompt_arg, record, overrides, tools)
        return
    _execute_here(flags, model, prompt_arg, record, overrides, template, continuing=continuing, tools=tools)


def _execute_here(flags: Mapping[str, Any], model: str, prompt_arg: str | None, record: Any,
                  overrides: dict[str, Any], template: str | None, *, continuing: bool, tools: Any) -> None:
    """The model loaded here: resolve, place, load (meanwhile import the templates), answer."""
    from infer.cli.placement import explain, report
    from infer.runtime.loading import sampling_defaults

    resolved = resolve({**flags, "model": model})
    entry = resolved.entry  # an alias's defaults apply unless a flag says otherwise
    plan = load_plan(flags, resolved)
    if flags["explain"]:
        explain(plan.placed, resolved.reference)
        return
    from infer.cli.media import projector_for, prompt_and_media, with_media

    text, asked, media, mmproj = prompt_and_media(flags, prompt_arg, resolved)  # (before the model loads)
    system = flags["system"]
    if entry and entry.system and system is None and not flags["raw"] and record is None:
        system = entry.system
    loaded = plan.open_session_in_background()
    # While llama.cpp loads the model: import the template machinery (Jinja).
    from infer.cli.prompt_cache import open_cache
    from infer.quant.paths import template_cache_dir
    from infer.runtime.prompt import raw_prompt
    from infer.runtime.template import use_compiled_cache

    use_compiled_cache(template_cache_dir())
    cache = None if flags["no_cache"] or media else open_cache()  # (no media in the prompt cache yet)

    from infer.cli.speculation import attach

    with loaded() as session, projector_for(mmproj, session, media) as projector:
        attach(flags, session, plan.placed)
        if flags["verbose"]:
            report(plan.placed, session.model)
        preamble, thinking, media_prompt = 0, None, None
        if flags["raw"]:
            if not text:
                raise UsageError("the prompt is empty")
            prompt = raw_prompt(session.model, text)
            tokens = prompt.tokens
        else:
            record = _ask(record, resolved.reference, system, text)
            prompt, tokens, thinking, preamble = _chat_prompt(flags, session.model, record.messages, template,
                                                          cached=cache is not None, tools=tools)
        if projector is not None:
            tokens, media_prompt = with_media(projector, session.model, prompt, tokens, media, record, asked)
        if flags["show_prompt"]:
            _write(prompt.text if prompt.text.endswith("\n") else prompt.text + "\n")
            return
        from infer.runtime.sampling import SamplingParams

        params = SamplingParams.resolve(sampling_defaults(session.model, resolved), overrides)
        reply = _reply(flags)
        if tools is not None and tools.active:
            params, reply = _calling(session.model, template, tools, params, reply)
        completion = _generate_cached(session, tokens, params, cache, name=resolved.reference,
                                      preamble=preamble, continuing=continuing, reply=reply,
                                      thinking=thinking, media_prompt=media_prompt)
    resolved.record_use()
    _report(flags, resolved.reference, completion, record, reply)


def _calling(model: Any, template: str | None, tools: Any, params: Any, reply: _Reply) -> tuple[Any, Any]:
    """The sampling parameters and the reply of a run that may call tools (cli/run_tools.py)."""
    from infer.cli.run_tools import CallReply
    from infer.runtime.prompt import tool_syntax
    from infer.runtime.tool_grammar import calls_params

    syntax = tool_syntax(model, template)
    return calls_params(params, syntax, tools, model), CallReply(reply, syntax, tools)


def _chat_prompt(flags: Mapping[str, Any], model: Any, messages: Any, template: str | None, *,
                 cached: bool, tools: Any = None) -> tuple[Any, list[int], Any, int]:
    """The rendered prompt (with the tools a reply may call), the tokens to generate from, a
    thinking model's plan (-v says what --think or --reasoning-budget cannot apply), and where
    the prompt cache saves a state."""
    from infer.runtime.prompt import preamble_len
    from infer.runtime.thinking_prompt import thinking_prompt

    rendered = thinking_prompt(model, messages, template=template, request=thinking_request(flags),
                               tools=tools.tools if tools is not None and tools.active else ())
    if flags["verbose"]:
        for note in rendered.notes:
            sys.stderr.write(f"infer: {note}\n")
    preamble = 0
    if cached:  # where the prompt cache saves a state: two more renderings
        preamble = preamble_len(model, messages, rendered.prompt.tokens, template=template,
                                variables=rendered.variables)
    return rendered.prompt, rendered.tokens, rendered.plan, preamble


def _ask(record: Any, model: str, system: str | None, text: str) -> Any:
    """The conversation with the user's message added (a new one if `record` is None)."""
    from infer.cli import conversations

    record = record or conversations.Record.new(model)
    record.model = model
    if system is not None:
        record.messages = [m for m in record.messages if m["role"] != "system"]
        record.messages.insert(0, {"role": "system", "content": system})
    record.messages.append({"role": "user", "content": text})
    return record


def _report(flags: Mapping[str, Any], model: str, completion: Any, record: Any, reply: Any) -> None:
    """After the reply: its tool calls, the conversation saved, --json's object, -v's statistics."""
    from infer.cli import conversations

    if hasattr(reply, "settle"):  # (cli/run_tools.CallReply)
        reply.settle(completion)
    if completion.tool_calls and not flags["json_output"]:
        from infer.cli.run_tools import print_calls

        print_calls(completion.tool_calls)
    if record is not None:
        record.messages.append(completion.message())
        conversations.save(record)
    if flags["json_output"]:
        from infer.cli.result_json import result_json

        result = result_json(model, completion)
        if record is not None:
            result["conversation"] = record.id
        _write(json.dumps(result, ensure_ascii=False) + "\n")
    if flags["verbose"]:
        _print_stats(completion, record.id if record else None, reply.thinking_s)


def _execute_remote(flags: Mapping[str, Any], where: remote.Address, model: str, prompt_arg: str | None,
                    record: Any, overrides: Mapping[str, Any], tools: Any) -> None:
    """`infer run` through the server at `where`: the same prompt, output and exit codes."""
    from infer.cli import remote
    fields = remote.request_fields(overrides)
    media: list[Any] = []
    if flags.get("image") or flags.get("audio"):  # (sent as data: URLs: the server's projector reads them)
        from infer.cli.media import media_and_prompt

        marked, text, media = media_and_prompt(flags, prompt_arg)
    else:  # (nothing more imported on this path than it needs: tests/test_cli_app.py)
        marked = text = combine_prompt(prompt_arg, sys.stdin.buffer, sys.stdin.isatty())
    if flags["raw"]:
        if media:
            raise UsageError("--image and --audio go in a chat message: not with --raw")
        if not text:
            raise UsageError("the prompt is empty")
        path, body = "/v1/completions", {"prompt": text}
    else:
        system = flags["system"]
        if system is None and record is None:
            system = remote.alias_system(model)
        record = _ask(record, model, system, text)  # (the saved conversation keeps the text as typed)
        asked = record.messages[-1]
        if media:
            from infer.runtime.media import openai_message

            asked = openai_message({"role": "user", "content": marked, "media": media})
        messages = [*record.messages[:-1], asked]
        path, body = "/v1/chat/completions", {"messages": messages}
        fields.update(remote.thinking_fields(*prompt_settings(flags), reasoning_budget(flags)))
        if tools is not None:
            from infer.cli.run_tools import request_fields

            fields.update(request_fields(tools))
    body.update(model=model, stream=True, stream_options={"include_usage": True}, **fields)
    reply = _reply(flags)
    try:  # (Ctrl-C closes the connection: the server stops the request)
        completion = remote.generate(where, path, body, on_text=reply.piece, on_thought=reply.reasoning)
    finally:
        reply.end()
    if tools is not None:
        from infer.cli.run_tools import expect_calls

        expect_calls(completion, tools)
    _report(flags, model, completion, record, reply)


def _generate_cached(session: Any, tokens: list[int], params: Any, cache: Any, *, name: str, preamble: int,
                     continuing: bool, reply: _Reply, thinking: Any = None, media_prompt: Any = None) -> Any:
    """Generate through the prompt cache (None: without it).

    The cached state sharing the longest prefix is loaded first; states are saved
    at the end of the preamble (if long enough) and at the end of the run.
    """
    import time

    requested = time.perf_counter()  # time to first token counts the loading of a cached state
    if cache is None:
        try:
            return _generate(session, tokens, params, reply, started=requested, thinking=thinking,
                             media_prompt=media_prompt)
        finally:
            if media_prompt is not None:  # (libmtmd's chunks)
                media_prompt.close()
    session.check_fits(len(tokens), params.max_tokens)
    # A continued conversation's own state is worth loading however short it is.
    cache.restore(session, tokens, min_tokens=1 if continuing else None)
    completion = _generate(session, tokens, params, reply, started=requested, thinking=thinking,
                           checkpoints=(preamble,) if preamble >= cache.min_tokens else (),
                           on_checkpoint=lambda n: cache.store(session, name, wait=False))
    # The end of the conversation: for --continue, and for the same prompt again.
    cache.store(session, name, min_tokens=1, wait=False)
    cache.flush()
    return completion


def _generate(session: Any, tokens: list[int], params: Any, reply: _Reply, *, thinking: Any = None,
              **options: Any) -> Any:
    """The reply shown as it streams (`reply`), a thinking model's reasoning apart (`thinking`:
    its prompt's runtime.thinking.ThinkingPlan); the Completion. `options` go to generate."""
    from infer.runtime.results import Completion, Piece, Thought
    from infer.runtime.thinking import split_events

    try:
        events = session.generate(tokens, params, thinking=thinking, **options)
        for event in split_events(events, thinking, session.model):
            if isinstance(event, Piece):
                reply.piece(event.text)
            elif isinstance(event, Thought):
                reply.reasoning(event.text)
            elif isinstance(event, Completion):
                completion = event
    finally:  # (also on Ctrl-C: the line ended)
        reply.end()
    return completion


def _reply(flags: Mapping[str, Any]) -> _Reply:
    """The answer to stdout (not with --json); the reasoning as --show-thinking and
    --hide-thinking say."""
    from infer.cli.thinking_display import thinking_display

    json_output = flags["json_output"]
    return _Reply(stream=not json_output, display=thinking_display(flags, hidden=json_output))


class _Reply:
    """Where a reply's text goes as it streams: the answer to stdout (unless `stream` is off,
    for --json); a thinking model's reasoning to its `display` (cli/thinking_display.py)."""

    def __init__(self, *, stream: bool, display: Any) -> None:
        self.stream, self.display = stream, display
        self.last = ""  # the last answer text written
        self.thought_at: float | None = None  # when the reasoning began, and the answer after it
        self.answered_at: float | None = None

    @property
    def thinking_s(self) -> float | None:
        """How long the model thought (None: it did not)."""
        if self.thought_at is None:
            return None
        return (self.answered_at or time.perf_counter()) - self.thought_at

    def piece(self, text: str) -> None:
        if self.thought_at is not None and self.answered_at is None:
            self.answered_at = time.perf_counter()
        if self.stream:
            if not self.last:
                self.display.end()
            _write(text)
            self.last = text

    def reasoning(self, text: str) -> None:
        if self.thought_at is None:
            self.thought_at = time.perf_counter()
        self.display.write(text)

    def end(self) -> None:
        self.display.end()
        if self.stream and self.last and not self.last.endswith("\n"):
            _write("\n")


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _print_stats(c: Any, conversation: str | None, thinking_s: float | None) -> None:
    from infer.cli.speculation import describe

    t, u = c.timings, c.usage
    lines = [
        *([f"conversation: {conversation} (continue with -C, or --conversation {conversation})"]
          if conversation else []),
        f"finish: {c.finish_reason}    seed: {c.seed}",
        f"prompt: {u.prompt_tokens} tokens ({u.cached_tokens} cached)    "
        f"completion: {u.completion_tokens} tokens",
        f"load: {t.load_ms:.0f} ms    time to first token: {t.ttft_ms:.0f} ms",
        f"prefill: {t.prefill_ms:.0f} ms ({t.prefill_tps:.1f} tokens/s)    "
        f"decode: {t.decode_ms:.0f} ms ({t.decode_tps(u.completion_tokens):.1f} tokens/s)",
        describe(u, t),
        *([f"thinking: {c.reasoning_tokens} of the {u.completion_tokens} completion tokens"
           + (f", {thinking_s:.1f} s" if thinking_s is not None else "")] if c.reasoning is not None else []),
    ]
    sys.stderr.write("".join(f"infer: {line}\n" for line in lines))
    sys.stderr.flush()
