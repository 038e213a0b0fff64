"""From messages or raw text to prompt tokens, so that typed text never becomes a control token.

The chat template's own markup (``<|im_start|>``, ``[INST]``...) must be parsed
as special tokens; text the user typed must not be, even when it spells one.
Usually the messages contain no special-token text and the rendered prompt is
tokenized exactly as llama.cpp would. When a message does spell a special token,
each such occurrence is replaced by a private-use placeholder before rendering,
and the placeholders are tokenized back as plain text afterwards.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infer.runtime import template as chat_template
from infer.runtime.llama import Model

Message = dict[str, Any]

# Private-use code points: they survive template filters (trim, upper...) unchanged
# and never occur in real prompts.
_PH_OPEN, _PH_CLOSE = "\ue000", "\ue001"
_PLACEHOLDER = re.compile(f"{_PH_OPEN}(\\d+){_PH_CLOSE}")

# Used when the model has no chat template of its own (llama.cpp's built-in names).
FALLBACK_TEMPLATE = "chatml"


@dataclass(frozen=True)
class Prompt:
    text: str
    tokens: list[int]


def raw_prompt(model: Model, text: str) -> Prompt:
    """A prompt with no chat template: all of it is plain text, plus BOS if the model uses one."""
    return Prompt(text, model.tokenize(text, add_special=True, parse_special=False))


def chat_prompt(model: Model, messages: Sequence[Message], *, template: str | None = None,
                add_generation_prompt: bool = True, variables: Mapping[str, Any] | None = None) -> Prompt:
    """Render `messages` with `template` (default: the model's own) and its `variables`
    (enable_thinking...), and tokenize safely."""
    specials = _special_strings(model, messages)
    if specials:
        messages, literals = _with_placeholders(messages, specials)
    text = render_chat(model, messages, template=template,
                       add_generation_prompt=add_generation_prompt, variables=variables)
    if not specials:
        return Prompt(text, _drop_double_bos(model, model.tokenize(
            text, add_special=adds_bos(model, text), parse_special=True)))
    tokens: list[int] = []
    plain_parts: list[str] = []
    pos = 0
    add_special = adds_bos(model, text)
    for m in _PLACEHOLDER.finditer(text):
        tokens += model.tokenize(text[pos:m.start()], parse_special=True,
                                 add_special=not tokens and pos == 0 and add_special)
        literal = literals[int(m.group(1))]
        tokens += model.tokenize(literal, add_special=False, parse_special=False)
        plain_parts.append(text[pos:m.start()] + literal)
        pos = m.end()
    tokens += model.tokenize(text[pos:], add_special=not tokens and add_special, parse_special=True)
    plain_parts.append(text[pos:])
    return Prompt("".join(plain_parts), _drop_double_bos(model, tokens))


def render_chat(model: Model, messages: Sequence[Message], *, template: str | None = None,
                add_generation_prompt: bool = True, variables: Mapping[str, Any] | None = None) -> str:
    """The prompt text for `messages`: a Jinja template, or llama.cpp's built-in fallback."""
    source = template if template is not None else model.chat_template()
    if source:
        return chat_template.render(source, messages, **_template_tokens(model),
                                    add_generation_prompt=add_generation_prompt, variables=variables)
    text = model.apply_builtin_template(FALLBACK_TEMPLATE, messages,
                                        add_generation_prompt=add_generation_prompt)
    if text is None:
        raise chat_template.TemplateError("the model has no chat template (use --raw)")
    return text


def _special_strings(model: Model, messages: Sequence[Message]) -> set[str]:
    """Every special-token text that occurs in the messages' contents."""
    found: set[str] = set()
    for m in messages:
        content = m.get("content")
        if not isinstance(content, str) or not content:
            continue
        tokens = model.tokenize(content, add_special=False, parse_special=True)
        for t in tokens:
            if model.is_control(t):
                text = model.special_token_text(t)
                if text:
                    found.add(text)
    return found


def _with_placeholders(messages: Sequence[Message],
                       specials: set[str]) -> tuple[list[Message], list[str]]:
    """Messages whose special-token texts are swapped for numbered placeholders."""
    pattern = re.compile("|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)))
    literals: list[str] = []

    def swap(match: re.Match[str]) -> str:
        literals.append(match.group(0))
        return f"{_PH_OPEN}{len(literals) - 1}{_PH_CLOSE}"

    out = []
    for m in messages:
        m = dict(m)
        if isinstance(m.get("content"), str):
            m["content"] = pattern.sub(swap, m["content"])
        out.append(m)
    return out, literals


def adds_bos(model: Model, text: str) -> bool:
    """Whether llama.cpp should add its special tokens to the rendered `text`: not when
    the template wrote BOS itself (llama.cpp would add a second and log a warning)."""
    return not (model.bos >= 0 and text.startswith(model.special_token_text(model.bos) or "\0"))


def _drop_double_bos(model: Model, tokens: list[int]) -> list[int]:
    """Templates often write BOS themselves; llama.cpp adds one too. Keep one."""
    if len(tokens) >= 2 and model.bos >= 0 and tokens[0] == model.bos == tokens[1]:
        return tokens[1:]
    return tokens


def preamble_len(model: Model, messages: Sequence[Message], tokens: Sequence[int], *,
                 template: str | None = None, variables: Mapping[str, Any] | None = None) -> int:
    """How many of `tokens` (the prompt of `messages`) come before its last message's text.

    That part (the system prompt, few-shot examples, earlier turns, the template's
    markup) comes back unchanged with the next question: the prompt cache saves a
    state there. Found by rendering the messages with two different last messages
    and keeping what the two share, so that it also holds for templates that write
    the system prompt inside the user's turn (Mistral's). 0 when the template cannot
    render them.
    """
    from infer.runtime.errors import InferError
    from infer.runtime.session import common_prefix_len

    if not messages:
        return 0
    try:
        a, b = (chat_prompt(model, [*messages[:-1], {**messages[-1], "content": text}],
                            template=template, variables=variables).tokens for text in ("A", "B"))
    except InferError:
        return 0
    return min(common_prefix_len(a, b), common_prefix_len(a, tokens))


def template_variables(model: Model, *, template: str | None = None, think: str | None = None,
                       extra: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], str | None]:
    """The variables to render the chat template with: `think`'s switches as the template
    (default: the model's own) expects them, then `extra` (--chat-template-kwargs, which win);
    and a line on what `think` could not set (for -v), or None."""
    from infer.runtime.reasoning import think_variables

    variables: dict[str, Any] = {}
    note = None
    source = template if template is not None else model.chat_template()
    if think is not None and source:
        variables, note = think_variables(source, think, **_template_tokens(model))
    elif think is not None:
        note = f"the model has no chat template: --think {think} is not applied"
    return {**variables, **(extra or {})}, note


def reasoning_format(model: Model, template: str | None = None) -> Any:
    """The reasoning convention (runtime/reasoning.ReasoningFormat) of `template` (default:
    the model's own), or None: no template, or none in it."""
    from infer.runtime.reasoning import detect

    source = template if template is not None else model.chat_template()
    return detect(source, **_template_tokens(model)) if source else None


def tool_syntax(model: Model, template: str | None = None) -> Any:
    """How a reply writes tool calls (runtime/tool_syntax.ToolSyntax): as `template` (default:
    the model's own) writes them, or, where it writes none, in infer's generic form
    (runtime/tool_generic.py)."""
    from infer.runtime import tool_generic

    return template_syntax(model, template) or tool_generic.syntax()


def template_syntax(model: Model, template: str | None = None) -> Any:
    """How `template` (default: the model's own) writes tool calls, or None: no template, or
    no calls in it."""
    from infer.runtime.tool_syntax import learn

    source = template if template is not None else model.chat_template()
    return learn(source, **_template_tokens(model)) if source else None


def _template_tokens(model: Model) -> dict[str, str]:
    """The BOS and EOS texts a chat template is given."""
    return {"bos_token": model.special_token_text(model.bos) if model.bos >= 0 else "",
            "eos_token": model.special_token_text(model.eos) if model.eos >= 0 else ""}
