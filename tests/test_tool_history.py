"""A conversation with tool calls and their results (issue 33), as a client sends it in OpenAI's
shape, rendered by infer (runtime/chat_messages.py, then its template engine) and by the chat
template run directly through another implementation (transformers' renderer), with the
history in the form templates are written for (arguments as objects, the tool's name on its
result): the same prompt, for every template that writes calls."""

from __future__ import annotations

import copy
import json

import pytest
from test_tool_calls import TOOLS, WITH_CALLS, _template
from transformers.utils.chat_template_utils import render_jinja_template

from infer.runtime.chat_messages import chat_messages
from infer.runtime.template import render
from infer.runtime.tool_request import template_calls
from infer.runtime.tool_syntax import learn

ARGS = {"city": "Paris", "days": 2}
SENT = [  # (what OpenAI's client sends: arguments as a JSON string, the result by its call's id)
    {"role": "system", "content": "You help with the weather."},
    {"role": "user", "content": "Weather in Paris for two days?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "Ab3dE6gH9", "type": "function", "function": {"name": "get_weather",
                                                             "arguments": json.dumps(ARGS)}}]},
    {"role": "tool", "tool_call_id": "Ab3dE6gH9", "content": '{"sky": "clear", "high_c": 21}'},
    {"role": "assistant", "content": "Clear skies, 21 degrees."},
    {"role": "user", "content": "And tomorrow?"},
]


def _direct(strings: bool) -> list[dict]:
    """The history as templates read it: the call's arguments an object (`strings`: the JSON
    text, for a template that adds it to its text), the result named, the text of the turn with
    the call empty (most templates cannot take None there)."""
    messages = copy.deepcopy(SENT)
    messages[2]["content"] = ""
    messages[2]["tool_calls"][0]["function"]["arguments"] = json.dumps(ARGS) if strings else ARGS
    messages[3]["name"] = "get_weather"
    return messages


# transformers' sandbox lets no list grow (Kimi K2 Thinking's `ids.append`), and its `map`
# filter gives tojson a generator (llama.cpp's DeepSeek R1 template): minja runs both, and so
# does infer (runtime/template.py); the rest are compared
DIRECTLY = [name for name in WITH_CALLS if name not in ("Kimi-K2-Thinking", "llama-cpp-deepseek-r1")]


@pytest.mark.parametrize("name", DIRECTLY)
def test_a_history_with_calls_renders_as_the_template_run_directly(name: str) -> None:
    source = _template(name)
    tokens = {"bos_token": "<s>", "eos_token": "</s>"}
    strings = learn(source, **tokens).string_arguments
    try:
        expected = render_jinja_template([_direct(strings)], tools=TOOLS, chat_template=source,
                                         add_generation_prompt=True, **tokens)[0][0]
    except Exception as e:  # (a template transformers' renderer cannot run)
        pytest.fail(f"transformers cannot render {name}: {e}")
    messages = template_calls(chat_messages(SENT), strings=strings)  # (as infer's prompt has them)
    ours = render(source, messages, add_generation_prompt=True, variables={"tools": TOOLS}, **tokens)
    assert ours == expected
