"""`tool_choice: required` (issue 33): the grammar built from a template's call syntax makes the
embedded model write a call that the same syntax reads back, for a tool of the request, with
arguments that validate against its schema; one template of each shape of call."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from test_tool_calls import _template, _tool

from infer.runtime.chat_messages import chat_messages
from infer.runtime.params import ContextParams
from infer.runtime.results import Completion
from infer.runtime.sampling import SamplingParams
from infer.runtime.session import Session
from infer.runtime.thinking_prompt import thinking_prompt
from infer.runtime.tool_grammar import calls_grammar, calls_params
from infer.runtime.tool_request import parse_tools
from infer.runtime.tool_stream import ToolCallStream, split_calls
from infer.runtime.tool_syntax import learn

TOOLS = [_tool("get_weather", city="string", days="integer"),
         _tool("search", query="string", exact="boolean")]
for _t in TOOLS:
    _t["function"]["parameters"]["required"] = list(_t["function"]["parameters"]["properties"])
TOOLS[0]["function"]["parameters"]["properties"]["city"]["enum"] = ["Paris", "Rome"]
TOOLS[1]["function"]["parameters"]["properties"]["query"]["maxLength"] = 20

SHAPES = (
    "Qwen-Qwen3-0.6B",  # a JSON object in <tool_call> tags
    "meta-llama-Llama-3.2-3B-Instruct",  # a bare JSON object with "parameters"
    "meta-llama-Llama-3.3-70B-Instruct",  # the same, or <|python_tag|>NAME.call(key="value")
    "mistralai-Mistral-Nemo-Instruct-2407",  # a JSON list, each call with its id
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use",  # a list whose calls carry their number
    "Apertus-8B-Instruct",  # {"NAME": {...}}
    "deepseek-ai-DeepSeek-V3.1",  # name, then JSON arguments, between markers
    "moonshotai-Kimi-K2",  # functions.NAME:0
    "Mistral-Small-3.2-24B-Instruct-2506",  # [TOOL_CALLS]NAME[CALL_ID]id[ARGS]{...}
    "openai-gpt-oss-120b",  # to=functions.NAME ... <|message|>{...}<|call|>
    "Qwen3-Coder",  # <parameter=KEY>value</parameter>
    "GLM-4.7-Flash",  # <arg_key>KEY</arg_key><arg_value>value</arg_value>
    "deepseek-ai-DeepSeek-V3.2",  # DSML, string="true|false"
    "google-gemma-4-31B-it",  # call:NAME{key:<|"|>value<|"|>}
    "LFM2.5-8B-A1B",  # [NAME(key='value')]
    "meetkai-functionary-medium-v3.2",  # >>>NAME\n{...}, the prompt ending in ">>>"
)


@pytest.fixture(scope="module")
def session(smollm2: Path):
    with Session.open(smollm2, ContextParams(n_ctx=2048)) as s:
        yield s


@pytest.mark.parametrize("name", SHAPES)
def test_a_required_call_is_valid_and_reads_back(name: str, session: Session) -> None:
    """Under each shape's syntax: the call the grammar makes reads back whole and as it streams
    (the same call), valid for its tool; the template takes it back with the tool's result,
    and the model replies to that."""
    source = _template(name)
    syntax = learn(source, bos_token="<s>", eos_token="</s>")
    grammar = calls_grammar(syntax, TOOLS, parallel=False)
    ask = [{"role": "user", "content": "What's the weather in Paris?"}]
    params = SamplingParams(temperature=0, grammar=grammar, max_tokens=300)  # (DeepSeek: many tokens)
    prompt = session.model.tokenize("<|im_start|>user\nWhat's the weather in Paris?<|im_end|>\n"
                                    "<|im_start|>assistant\n", add_special=False, parse_special=True)
    events = _generate(session, prompt, params)
    done = events[-1]
    assert done.finish_reason == "eos", done.text  # the grammar ended: the call is whole
    stream = ToolCallStream(syntax, TOOLS)
    content = [e for e in stream.feed(done.text) + stream.finish() if isinstance(e, str)]
    (call,) = stream.calls
    assert call.done and "".join(content).strip() == "", done.text
    tool = next(t for t in TOOLS if t["function"]["name"] == call.name)
    jsonschema.validate(json.loads(call.arguments), tool["function"]["parameters"])
    streamed = ToolCallStream(syntax, TOOLS)
    for event in events[:-1]:
        streamed.feed(event.text)
    streamed.finish()
    assert [(c.name, c.arguments) for c in streamed.calls] == [(call.name, call.arguments)]
    named = calls_grammar(syntax, TOOLS, name="search", parallel=False)  # (tool_choice: one function)
    assert "get_weather" not in named and "search" in named
    # the call and its result go back as a client sends them
    history = chat_messages([*ask, {"role": "assistant", "content": None, "tool_calls": [call.as_openai()]},
                             {"role": "tool", "tool_call_id": call.id, "content": "sunny and 21 degrees"}])
    after = thinking_prompt(session.model, history, template=source, tools=TOOLS)
    assert "sunny and 21 degrees" in after.prompt.text
    assert call.name in after.prompt.text.split("sunny and 21 degrees")[0]
    # and the model replies after it (tool_choice auto): text, or another call, valid (its turn's
    # end ruled out: under some formats this model would end the turn at once)
    request = parse_tools({"tools": TOOLS, "tool_choice": "auto"})
    params = SamplingParams(temperature=0, max_tokens=16, logit_bias=((session.model.eos, -100.0),))
    reply = _generate(session, after.tokens, calls_params(params, syntax, request, session.model))[-1]
    reply = split_calls(reply, syntax, request)
    assert reply.text.strip() or reply.tool_calls, reply
    for again in reply.tool_calls:
        tool = next(t for t in TOOLS if t["function"]["name"] == again["function"]["name"])
        jsonschema.validate(json.loads(again["function"]["arguments"]), tool["function"]["parameters"])


def _generate(session: Session, prompt: list[int], params: SamplingParams) -> list:
    """The pieces of a reply from a fresh context, then its Completion."""
    session.context.memory_clear()
    session.tokens.clear()
    return list(session.generate(prompt, params))


def test_a_grammar_with_a_trigger_leaves_the_text_free_until_it(session: Session) -> None:
    """A grammar that waits for its trigger (`tool_choice: auto`): the reply is the model's own
    until the trigger's text, then held to the grammar from the pattern's group on, where that
    group may begin inside a token (here " so" completes "m so"); and where the token that
    completes the trigger goes on in a way the grammar refuses, the reply goes on free, where
    llama.cpp's own lazy grammar throws from C and ends the process."""
    prompt = session.model.tokenize("<|im_start|>user\nSay hello to me.<|im_end|>\n<|im_start|>assistant\n",
                                    add_special=False, parse_special=True)

    def reply(**grammar: object) -> Completion:
        return _generate(session, prompt, SamplingParams(temperature=0, max_tokens=20, **grammar))[-1]

    free = reply()
    assert free.text.startswith("I'm so glad ") and not free.text.startswith("I'm so glad to help.")
    held = reply(grammar='root ::= "glad to help."', _grammar_triggers=(r"[\s\S]*?(glad[\s\S]*)",))
    assert (held.text, held.finish_reason) == ("I'm so glad to help.", "eos")
    inside = reply(grammar='root ::= "m so very glad."', _grammar_triggers=(r"[\s\S]*?(m so[\s\S]*)",))
    assert (inside.text, inside.finish_reason) == ("I'm so very glad.", "eos")
    refused = reply(grammar='root ::= "I\'m sad."', _grammar_triggers=(r"[\s\S]*?(I'm s[\s\S]*)",))
    assert refused.text == free.text


def test_auto_holds_a_call_the_model_begins_to_its_grammar(session: Session) -> None:
    """`tool_choice: auto`: the model is free to write text, and once it begins a call (here
    nudged to begin with "<" under Qwen 3's template, which shows `<tool_call>` calls), the
    call is held to the grammar: a whole call (one: parallel_tool_calls is false) of a tool,
    with valid arguments, and the reply ends there. The same nudge
    without the grammar gives no call at all, so the grammar is what made them valid."""
    template = _template("Qwen-Qwen3-0.6B")
    syntax = learn(template)
    request = parse_tools({"tools": TOOLS, "tool_choice": "auto", "parallel_tool_calls": False})
    prompt = thinking_prompt(session.model, [{"role": "user", "content": "What's the weather in Paris?"}],
                             template=template, tools=TOOLS).tokens
    (lt,) = session.model.tokenize("<", add_special=False, parse_special=False)
    nudged = SamplingParams(temperature=0, max_tokens=150, logit_bias=((lt, 8.0),))

    def reply(params: SamplingParams) -> Completion:
        return split_calls(_generate(session, prompt, params)[-1], syntax, request)

    held = reply(calls_params(nudged, syntax, request))
    assert len(held.tool_calls) == 1 and held.finish_reason == "tool_calls" and held.text == ""
    for call in held.tool_calls:
        tool = next(t for t in TOOLS if t["function"]["name"] == call["function"]["name"])
        jsonschema.validate(json.loads(call["function"]["arguments"]), tool["function"]["parameters"])
    free = reply(nudged)
    assert free.text.startswith("<tool_call>") and free.tool_calls == []
    assert calls_params(nudged, syntax, parse_tools({"tools": TOOLS, "tool_choice": "none"})) is nudged


# Calls between two of the embedded model's control tokens, as gpt-oss' <|channel|> or
# Mistral's [TOOL_CALLS] are control tokens of theirs
CONTROL = """{%- for m in messages -%}<|im_start|>{{ m.role }}
{% if m.tool_calls %}{% for c in m.tool_calls %}<jupyter_code>{"name": {{ c.function.name | tojson }}, \
"arguments": {{ c.function.arguments | tojson }}}<jupyter_output>{% endfor %}\
{% else %}{{ m.content }}{% endif %}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def test_call_markers_made_of_control_tokens_are_seen_in_the_reply(session: Session) -> None:
    """A control token's text is empty unless asked for: the markers of the calls are shown in
    the reply's text, so that the call the grammar made is read back."""
    from infer.runtime.template import render

    syntax = learn(CONTROL)
    (code,) = session.model.tokenize("<jupyter_code>", add_special=False, parse_special=True)
    assert syntax is not None and session.model.is_control(code)
    request = parse_tools({"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False})
    prompt = session.model.tokenize(render(CONTROL, [{"role": "user", "content": "Weather in Paris?"}]),
                                    add_special=False, parse_special=True)
    nudged = SamplingParams(temperature=0, max_tokens=120, logit_bias=((code, 50.0),))  # (not its text)
    done = _generate(session, prompt, calls_params(nudged, syntax, request, session.model))[-1]
    assert code in done.tokens
    (call,) = split_calls(done, syntax, request).tool_calls
    tool = next(t for t in TOOLS if t["function"]["name"] == call["function"]["name"])
    jsonschema.validate(json.loads(call["function"]["arguments"]), tool["function"]["parameters"])


# One call, closed by one of the embedded model's end-of-generation tokens, as gpt-oss closes
# its calls with <|call|> and Llama its built-in tools' with <|eom_id|>
ENDED = """{%- for m in messages -%}<|im_start|>{{ m.role }}
{% if m.tool_calls %}{% set c = m.tool_calls[0] %}<jupyter_code>{"name": {{ c.function.name | tojson }}, \
"arguments": {{ c.function.arguments | tojson }}}<|endoftext|>{% else %}{{ m.content }}{% endif %}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def test_calls_closed_by_an_end_of_generation_token_end_with_that_token(session: Session) -> None:
    """A grammar lets an end-of-generation token through only once it is complete: the call's
    grammar ends before the closing token, and the model ends the reply with the token itself
    rather than spelling its text out in pieces."""
    from infer.runtime.template import render

    syntax = learn(ENDED)
    assert syntax is not None and syntax.section_close == "<|endoftext|>"
    request = parse_tools({"tools": TOOLS, "tool_choice": "required"})
    prompt = session.model.tokenize(render(ENDED, [{"role": "user", "content": "Weather in Paris?"}]),
                                    add_special=False, parse_special=True)
    params = calls_params(SamplingParams(temperature=0, max_tokens=120), syntax, request, session.model)
    done = _generate(session, prompt, params)[-1]
    assert done.finish_reason == "eos" and "endoftext" not in done.text, done.text
    (call,) = split_calls(done, syntax, request).tool_calls
    tool = next(t for t in TOOLS if t["function"]["name"] == call["function"]["name"])
    jsonschema.validate(json.loads(call["function"]["arguments"]), tool["function"]["parameters"])


def test_the_grammar_converter_loads_whole_for_threads_asking_together() -> None:
    """The server prepares requests in threads; the first requests with tools (or a JSON
    schema) load llama-cpp-python's grammar converter together, and each must get the whole
    module (a module is in sys.modules before it has run: one of them got no SchemaConverter,
    and its request a 500)."""
    import subprocess
    import sys

    code = """if True:
        import threading
        from infer.runtime.llama import load_bindings_module
        bad = []
        def load():
            try:
                if not hasattr(load_bindings_module("llama_grammar"), "SchemaConverter"):
                    bad.append("partial")
            except Exception as e:
                bad.append(repr(e))
        threads = [threading.Thread(target=load) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(len(bad))"""
    for _ in range(3):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and r.stdout.strip() == "0", r.stdout + r.stderr


def test_a_tool_with_numeric_bounds_is_called_unless_it_is_strict(session: Session) -> None:
    """Agents' tools carry keywords no grammar here enforces (Claude Code's Read tool: `minimum`,
    `exclusiveMinimum`, `maximum`): a tool that is not `strict` is called with arguments held
    to the rest of its schema (the bounds are the model's to keep, as OpenAI's and Anthropic's
    APIs treat a schema that is not strict); a `strict` one is refused, naming the keyword. So
    is a length far above what a grammar holds (its Workflow tool's `maxLength` of 524,288). A
    property whose schema has only a description takes any value (its Workflow tool's `args`)."""
    from infer.runtime.errors import UsageError
    from infer.runtime.json_schema import without_unsupported_keywords

    read = _tool("read", path="string", offset="integer", limit="integer")
    params = read["function"]["parameters"]
    params["required"] = ["path"]
    params["properties"]["offset"]["minimum"] = 0
    params["properties"]["limit"].update(exclusiveMinimum=0, maximum=2000)
    params["properties"]["note"] = {"description": "Anything to remember."}
    params["properties"]["path"]["maxLength"] = 524288  # (written out in full, it would crash llama.cpp)
    syntax = learn(_template("Qwen-Qwen3-0.6B"), bos_token="<s>", eos_token="</s>")
    grammar = calls_grammar(syntax, [read], parallel=False)
    prompt = session.model.tokenize("<|im_start|>user\nRead lines 10 to 20 of notes.txt<|im_end|>\n"
                                    "<|im_start|>assistant\n", add_special=False, parse_special=True)
    done = _generate(session, prompt, SamplingParams(temperature=0, grammar=grammar, max_tokens=100))[-1]
    assert done.finish_reason == "eos", done.text
    stream = ToolCallStream(syntax, [read])
    stream.feed(done.text)
    stream.finish()
    (call,) = stream.calls
    jsonschema.validate(json.loads(call.arguments), without_unsupported_keywords(params))
    strict = {"type": "function", "function": {**read["function"], "strict": True}}
    with pytest.raises(UsageError, match="minimum"):
        calls_grammar(syntax, [strict], parallel=False)
