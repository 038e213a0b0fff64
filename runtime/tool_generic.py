"""Tool calls for chat templates that write none infer can read (issue 33): SmolLM2's, Gemma 3's,
SmolLM3's and Granite 3.3's prose, any template that knows no tools.

The tools are described in the system message, with the form a call takes: one JSON object,
`{"tool_calls": [{"name": …, "arguments": {…}}]}`, after any text. That form is a template of
its own (`TEMPLATE`), and everything else follows from it as from any model's template: the
syntax is learned from it (runtime/tool_syntax.learn), so the same grammar holds a call
(`required`, or `auto` from the object's opening on) and the same reader takes the calls
apart. An earlier turn's calls are written into its text as that template writes them, and
a tool's result goes back as a user message (a template that knows no calls knows no `tool`
role either) holding `{"tool_response": …}`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from infer.runtime.template import render
from infer.runtime.tool_syntax import ToolSyntax, learn
from infer.runtime.tool_turn import empty_block, turn_calls

TEMPLATE = (
    '{%- for m in messages -%}<|{{ m.role }}|>{{ m.content or "" }}'
    '{%- if m.tool_calls -%}{{ "\\n" if m.content else "" }}{"tool_calls": ['
    '{%- for c in m.tool_calls -%}{{ ", " if not loop.first else "" }}'
    '{"name": {{ c.function.name | tojson }}, "arguments": {{ c.function.arguments | tojson }}}'
    '{%- endfor -%}]}{%- endif -%}<|end|>{%- endfor -%}'
    '{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}')

_ABOUT = """You can call these tools (each line one tool: its name, what it does, and the JSON schema \
of its arguments):
{tools}

To call tools, end your reply with one JSON object in this form, and write nothing after it:
{{"tool_calls": [{{"name": "<tool name>", "arguments": {{<the arguments>}}}}]}}
The results come back in a message holding {{"tool_response": …}}. Without a call, reply in plain text."""


def syntax() -> ToolSyntax:
    learned = learn(TEMPLATE)
    assert learned is not None, "the generic template writes calls"
    return learned


def described(messages: Sequence[Mapping[str, Any]],
              tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`messages` for a template that knows no tools: the tools described in the system message
    (where there are tools), earlier calls written into their turn's text, tool results as user
    messages (consecutive ones together)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = [dict(c) for c in m["tool_calls"]]
            text = written(TEMPLATE, [], calls, str(m.get("content") or "")).strip()
            out.append({**{k: v for k, v in m.items() if k != "tool_calls"}, "content": text})
        elif m.get("role") == "tool":
            response = {"name": m.get("name", ""), "tool_call_id": m.get("tool_call_id"),
                        "content": m.get("content")}
            result = json.dumps({"tool_response": response}, ensure_ascii=False)
            if out and out[-1].get("tool_results"):
                out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + result}
            else:
                out.append({"role": "user", "content": result, "tool_results": True})
        else:
            out.append(dict(m))
    for m in out:
        m.pop("tool_results", None)
    if not tools:
        return out
    listed = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)
    about = _ABOUT.format(tools=listed)
    if out and out[0].get("role") == "system":
        return [{**out[0], "content": f"{out[0]['content']}\n\n{about}"}, *out[1:]]
    return [{"role": "system", "content": about}, *out]


def written(source: str, tools: list[dict[str, Any]], calls: list[dict[str, Any]], content: str = "", *,
            bos_token: str = "", eos_token: str = "") -> str:
    """What a reply with `content` and `calls` (OpenAI's tool_calls) is, as the template writes
    such a turn after a user's: the text a model trained on it generates (tests read it back)."""

    def rendered(messages: list[dict[str, Any]], generation: bool = False) -> str:
        return render(source, messages, bos_token=bos_token, eos_token=eos_token,
                      add_generation_prompt=generation, variables={"tools": tools})

    syntax = learn(source, bos_token=bos_token, eos_token=eos_token)
    if syntax is not None and syntax.string_arguments:
        calls = [{**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
                 for c in calls]
    added, kept = turn_calls(rendered, calls, empty_block(source, bos_token, eos_token))
    if syntax is None or not syntax.prompted:
        return (content if kept and content else "") + added
    # (the generation prompt wrote the start of the calls' opening: the reply begins after it)
    text = syntax.content_lead + content + added if kept and content else added
    return text[len(syntax.prompted):] if text.startswith(syntax.prompted) else text


def needs(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether `messages` hold calls or tool results (which a template that knows no tools
    would drop)."""
    return any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)
