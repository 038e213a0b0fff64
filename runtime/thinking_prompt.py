"""A chat prompt rendered for what a request asks of a thinking model (issue 32): the
template's thinking switches set (--think, `reasoning_effort`), more template variables
(--chat-template-kwargs), and the reply's plan (runtime/thinking.py) with its budget. What
`infer run`, `infer chat`, `infer batch` and the server share."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from infer.runtime.reasoning import ReasoningSplitter
from infer.runtime.thinking import ThinkingPlan


@dataclass(frozen=True)
class ThinkingRequest:
    """What a request asks of a thinking model (runtime/request_params.py's "prompt" group):
    a thinking level (`think`: on, off, low, medium, high; None: the template's default), more
    chat template variables (`variables`: --chat-template-kwargs, which win), at most `budget`
    tokens of thinking (None or -1: no limit), and whether the reasoning is returned apart from
    the answer (`separate`; a server's `reasoning_format: none` keeps it in the text)."""

    think: str | None = None
    variables: Mapping[str, Any] = field(default_factory=dict)
    budget: int | None = None
    separate: bool = True


@dataclass(frozen=True)
class ThinkingPrompt:
    """A chat prompt rendered for a `ThinkingRequest`: the rendering (`prompt`), the tokens to
    generate from (a budget of 0 may close the block in them), the thinking plan (None: the
    template has no reasoning convention), the template's variables, and what could not apply."""

    prompt: Any  # runtime/prompt.Prompt
    tokens: list[int]
    plan: ThinkingPlan | None
    variables: dict[str, Any]
    notes: tuple[str, ...]
    separate: bool = True

    def splitter(self) -> ReasoningSplitter | None:
        """A splitter for the reply, where its reasoning is returned apart; else None."""
        return self.plan.splitter() if self.plan is not None and self.separate else None


def plan_thinking(model: Any, prompt_text: str, tokens: Sequence[int], *, template: str | None = None,
                  budget: int | None = None) -> tuple[list[int], ThinkingPlan | None, str | None]:
    """A chat prompt's thinking plan (None: the template has no reasoning convention), its
    tokens (a budget of 0 closes a block the prompt opened, in the prompt itself), and a line
    on what could not apply (for -v), or None. `budget`: tokens of thinking at most (None or
    -1: no limit)."""
    from infer.runtime.prompt import reasoning_format

    fmt = reasoning_format(model, template)
    limit = None if budget is None or budget < 0 else budget
    if fmt is None:
        note = None if limit is None else "the chat template has no reasoning convention: the reasoning " \
                                          "budget is not applied"
        return list(tokens), None, note
    opened = fmt.starts_open_with(prompt_text)
    closer = tuple(model.tokenize(fmt.close, add_special=False, parse_special=True))
    opener = model.tokenize(fmt.open, add_special=False, parse_special=True) if fmt.open else []
    wrapper = model.tokenize(fmt.answer_open + fmt.answer_close, add_special=False, parse_special=True)
    special = frozenset(t for t in (*opener, *closer, *wrapper) if model.is_control(t))
    if limit == 0 and opened is True:
        return [*tokens, *closer], ThinkingPlan(fmt, False, special=special), None
    lead = ""
    marker = fmt.open.rstrip()
    if opened is True and marker and marker in prompt_text:
        lead = prompt_text[prompt_text.rindex(marker) + len(marker):]
    return list(tokens), ThinkingPlan(fmt, opened, limit, closer, special, lead), None


def thinking_prompt(model: Any, messages: Sequence[Mapping[str, Any]], *, template: str | None = None,
                    request: ThinkingRequest | None = None,
                    tools: Sequence[Mapping[str, Any]] = ()) -> ThinkingPrompt:
    """Render `messages` (with the template's thinking switches as `request` asks, and the
    `tools` the reply may call) and plan the reply's thinking: what `infer run`, `infer chat`,
    `infer batch` and the server share."""
    from infer.runtime import tool_generic
    from infer.runtime.prompt import chat_prompt, template_syntax, template_variables
    from infer.runtime.tool_request import template_calls, template_tools

    request = request or ThinkingRequest()
    syntax = template_syntax(model, template) if tools or tool_generic.needs(messages) else None
    # An earlier turn's calls with their arguments as objects, as most templates walk them (a
    # saved conversation keeps OpenAI's JSON strings), or as JSON text where the template wants it
    messages = template_calls(list(messages), strings=syntax is not None and syntax.string_arguments)
    if (tools or tool_generic.needs(messages)) and syntax is None:
        messages, tools = tool_generic.described(messages, tools), ()  # (the template knows no tools)
    # An earlier reply's reasoning under the names templates read it by (most the first;
    # `thinking`: GLM's and Ollama's; `reasoning`: Solar Open's and vLLM's)
    messages = [{"thinking": m["reasoning_content"], "reasoning": m["reasoning_content"], **m}
                if m.get("reasoning_content") else m for m in messages]
    variables, note = template_variables(model, template=template, think=request.think,
                                         extra=request.variables)
    if tools:
        source = template if template is not None else model.chat_template() or ""
        variables = {**template_tools(tools, source), **variables}
    prompt = chat_prompt(model, messages, template=template, variables=variables)
    tokens, plan, budget_note = plan_thinking(model, prompt.text, prompt.tokens, template=template,
                                              budget=request.budget)
    notes = tuple(n for n in (note, budget_note) if n is not None)
    return ThinkingPrompt(prompt, tokens, plan, variables, notes, request.separate)
