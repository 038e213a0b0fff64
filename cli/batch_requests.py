"""Each `infer batch` line as a request: rendered here for the scheduler (with its thinking
plan and tool calls to read from the reply), or as the body of a chat request to a server."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infer.cli.batch_input import Item
from infer.cli.flags import prompt_flags, thinking_request
from infer.runtime.errors import InferError, MediaError


def line_prompt_flags(flags: Mapping[str, Any]) -> dict[str, Any]:
    """The batch's thinking flags (--think...), which a line's own settings override; checked."""
    given = prompt_flags(flags)
    thinking_request(given)
    return given


@dataclass
class Finish:
    """What is read from a line's reply once it is whole: a thinking model's reasoning, then
    the tool calls of the line's tools."""

    plan: Any = None  # runtime.thinking.ThinkingPlan
    syntax: Any = None  # runtime.tool_syntax.ToolSyntax, with `tools`
    tools: Any = None  # runtime.tool_request.ToolRequest

    def __call__(self, completion: Any, model: Any) -> Any:
        from infer.runtime.thinking import split_completion
        from infer.runtime.tool_stream import split_calls

        split_completion(completion, self.plan, model)
        if self.syntax is not None:
            split_calls(completion, self.syntax, self.tools)
        return completion


def local_requests(model: Any, items: list[Item], defaults: dict[str, Any], overrides: dict[str, Any],
                   prompt_flags: dict[str, Any], template: str | None, projector: Any = None, *,
                   max_media: int | None = None
                   ) -> tuple[list[Any], list[tuple[int, str]], dict[int, Finish]]:
    """Scheduler requests for the items that can run, (index, error) for the others, and what
    to read from each request's reply (by index). A line's media are read by `projector`."""
    from infer.runtime.media import media_of, media_prompt, text_only
    from infer.runtime.prompt import adds_bos, tool_syntax
    from infer.runtime.request import Request
    from infer.runtime.sampling import SamplingParams
    from infer.runtime.thinking_prompt import thinking_prompt
    from infer.runtime.tool_grammar import calls_params

    requests, errors, finishes = [], [], {}
    for item in items:
        if item.error is not None:
            errors.append((item.index, item.error))
            continue
        try:
            params = SamplingParams.resolve(defaults, {**overrides, **item.settings})
            finish = Finish()
            if item.tools is not None and item.tools.active:
                finish.syntax, finish.tools = tool_syntax(model, template), item.tools
                params = calls_params(params, finish.syntax, item.tools, model)
            rendered = thinking_prompt(model, text_only(item.messages), template=template,
                                       request=thinking_request({**prompt_flags, **item.thinking}),
                                       tools=item.tools.tools if finish.tools is not None else ())
            tokens, mp, media = rendered.tokens, None, media_of(item.messages)
            if media:
                if projector is None:
                    raise MediaError(f"{media[0].name}: reading {media[0].kind} needs the model's "
                                     "projector: give --mmproj FILE")
                text = rendered.prompt.text
                mp = media_prompt(projector, text, media, add_special=adds_bos(model, text), limit=max_media)
                tokens = mp.tokens + tokens[len(rendered.prompt.tokens):]
        except InferError as e:
            errors.append((item.index, str(e)))
            continue
        finish.plan = rendered.plan
        requests.append(Request(item.index, tokens, params, thinking=rendered.plan, media=mp))
        finishes[item.index] = finish
    return requests, errors, finishes


def server_body(flags: Mapping[str, Any], item: Item, overrides: Mapping[str, Any],
                prompt_flags: dict[str, Any]) -> dict[str, Any]:
    """The chat request (streamed) that asks a server for a line's reply."""
    from infer.cli import remote
    from infer.cli.run_tools import request_fields

    thinking = thinking_request({**prompt_flags, **item.thinking})
    from infer.runtime.media import openai_message

    body = {"model": flags["model"], "messages": [openai_message(m) for m in item.messages], "stream": True,
            "stream_options": {"include_usage": True},
            **remote.request_fields({**overrides, **item.settings}),
            **remote.thinking_fields(thinking.think, thinking.variables, thinking.budget)}
    if item.tools is not None:
        body.update(request_fields(item.tools))
    return body
