"""Tool calling through `infer serve` (issue 33), driven by OpenAI's own client, on the embedded
model under Qwen 3's chat template (its `<tool_call>` JSON calls): `tool_choice: required` and a
named function give valid calls, streamed the same as whole; calls the model writes by itself
come apart from the content with no marker left in it; the tool's result goes back in."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import openai
import pytest
from conftest import run_cli
from serve_helpers import Server

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                      "parameters": {"type": "object", "required": ["city"], "properties": {
                                          "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
                                          "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "add", "description": "Add two numbers.",
                                      "parameters": {"type": "object", "required": ["a", "b"], "properties": {
                                          "a": {"type": "integer"}, "b": {"type": "integer"}}}}},
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture
def server(qwen3_server: Server) -> Server:
    return qwen3_server


@pytest.fixture
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _valid(call) -> dict:
    tool = next(t for t in TOOLS if t["function"]["name"] == call.function.name)
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, tool["function"]["parameters"])
    return arguments


def test_required_gives_a_valid_call_streamed_the_same_as_whole(client: openai.OpenAI) -> None:
    asked = {"model": "smollm2", "messages": ASK, "tools": TOOLS, "tool_choice": "required",
             "temperature": 0, "max_tokens": 80, "parallel_tool_calls": False}
    whole = client.chat.completions.create(**asked).choices[0]
    assert whole.finish_reason == "tool_calls"
    assert whole.message.content is None and len(whole.message.tool_calls) == 1
    call = whole.message.tool_calls[0]
    assert call.type == "function" and call.id
    _valid(call)
    with client.chat.completions.stream(**asked) as stream:
        contents = [e.delta for e in stream if e.type == "content.delta"]
        streamed = stream.get_final_completion().choices[0]
    assert "".join(contents) == ""  # nothing of the call ever reached the content
    assert [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls] == \
        [(call.function.name, call.function.arguments)]
    assert streamed.finish_reason == "tool_calls"


def test_a_named_function_is_the_one_called(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Add 2 and 3."}], tools=TOOLS, temperature=0,
        tool_choice={"type": "function", "function": {"name": "add"}}, max_tokens=60).choices[0]
    (call,) = reply.message.tool_calls
    assert call.function.name == "add" and set(_valid(call)) == {"a", "b"}


def test_calls_the_model_writes_itself_come_apart_from_the_content(client: openai.OpenAI) -> None:
    """With `auto`, text before a call is content; the call is parsed out of the reply, and no
    marker reaches the content, streamed or not (the model is made to write one by a grammar)."""
    written = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
               '</tool_call>')
    asked = {"model": "smollm2", "messages": ASK, "tools": TOOLS, "temperature": 0, "max_tokens": 80,
             "extra_body": {"grammar": f"root ::= {json.dumps(written)}", "think": False}}
    whole = client.chat.completions.create(**asked).choices[0]
    assert whole.message.content == "Let me check."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls] == \
        [("get_weather", {"city": "Oslo"})]
    assert whole.finish_reason == "tool_calls"
    with client.chat.completions.stream(**asked) as stream:
        content = "".join(e.delta for e in stream if e.type == "content.delta")
        final = stream.get_final_completion().choices[0]
    assert "tool_call" not in content and content.strip() == "Let me check."
    assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == \
        [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]


def test_the_tools_result_goes_back_in_and_a_reply_follows(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(model="smollm2", messages=ASK, tools=TOOLS, tool_choice="required",
                                           temperature=0, max_tokens=80, parallel_tool_calls=False)
    call = first.choices[0].message.tool_calls[0]
    history = [*ASK, first.choices[0].message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 21, "sky": "clear"}'}]
    after = client.chat.completions.create(model="smollm2", messages=history, tools=TOOLS, temperature=0,
                                           max_tokens=20, tool_choice="none")
    assert after.choices[0].finish_reason in ("stop", "length") and after.choices[0].message.content
    assert not after.choices[0].message.tool_calls
    # the result is in the prompt: the prompt grows by it
    empty = [*history[:-1], {"role": "tool", "tool_call_id": call.id, "content": ""}]
    without = client.chat.completions.create(model="smollm2", messages=empty, tools=TOOLS, max_tokens=1,
                                             tool_choice="none")
    assert after.usage.prompt_tokens > without.usage.prompt_tokens


@pytest.mark.parametrize("fields, param", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
])
def test_bad_tool_fields_are_refused_naming_the_field(client: openai.OpenAI, fields: dict,
                                                      param: str) -> None:
    body = {"model": "smollm2", "messages": ASK, "tools": TOOLS, **fields}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(**body)
    assert caught.value.body["param"] == param


def test_auto_streams_a_call_the_model_begins_held_to_its_grammar(client: openai.OpenAI, smollm2) -> None:
    """`tool_choice: auto` (the default): nudged to begin with "<", the model begins a
    `<tool_call>` and the grammar holds it to a valid call of one tool; streamed, the official
    client assembles the same call as the whole reply has, and no piece of it is content."""
    from infer.runtime.llama import Model

    with Model(smollm2, vocab_only=True) as model:
        (lt,) = model.tokenize("<", add_special=False, parse_special=False)
    asked = {"model": "smollm2", "messages": ASK, "tools": TOOLS, "temperature": 0, "max_tokens": 120,
             "logit_bias": {str(lt): 5}, "parallel_tool_calls": False, "extra_body": {"think": False}}
    whole = client.chat.completions.create(**asked).choices[0]
    assert whole.finish_reason == "tool_calls" and not whole.message.content, whole
    (call,) = whole.message.tool_calls
    _valid(call)
    with client.chat.completions.stream(**asked) as stream:
        content = "".join(e.delta for e in stream if e.type == "content.delta")
        final = stream.get_final_completion().choices[0]
    assert content == "" and final.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == \
        [(call.function.name, call.function.arguments)]


def test_infer_run_and_batch_through_the_server_give_the_calls(server: Server, tmp_path) -> None:
    """`infer run --tools` and `infer batch` lines with tools, sent to the server (INFER_SERVER):
    run prints each call as a JSON line (and --json has them in OpenAI's shape), a batch line's
    result has `tool_calls`; the same calls as the server's own reply."""
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    env = {"INFER_SERVER": server.url}
    args = ["run", "smollm2", ASK[0]["content"], "--tools", f"@{tools}", "--tool-choice", "get_weather",
            "--temp", "0", "--think", "off", "-n", "120"]
    plain = run_cli(*args, env=env)
    assert plain.returncode == 0, plain.stderr
    lines = [json.loads(line) for line in plain.stdout.splitlines()]
    assert lines and all(c["name"] == "get_weather" for c in lines)
    result = json.loads(run_cli(*args, "--json", env=env).stdout)
    assert result["finish_reason"] == "tool_calls" and result["text"] == ""
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in result["tool_calls"]]
    assert calls == [(c["name"], c["arguments"]) for c in lines]
    none = ["run", "smollm2", "Hi", "--tools", f"@{tools}", "--tool-choice", "none", "-n", "4", "--json"]
    assert "tool_calls" not in json.loads(run_cli(*none, env=env).stdout)  # (as in a local run)
    line = {"id": "w", "messages": ASK, "tools": TOOLS, "tool_choice": "required", "temperature": 0,
            "max_tokens": 120, "think": False, "parallel_tool_calls": False}
    batch = run_cli("batch", "smollm2", input=json.dumps(line) + "\n", env=env)
    assert batch.returncode == 0, batch.stderr
    (got,) = [json.loads(x) for x in batch.stdout.splitlines()]
    (call,) = got["tool_calls"]
    assert got["finish_reason"] == "tool_calls" and got["text"] == ""
    jsonschema.validate(json.loads(call["function"]["arguments"]),
                        next(t for t in TOOLS if t["function"]["name"] == call["function"]["name"])
                        ["function"]["parameters"])


def test_a_thinking_reply_gives_its_reasoning_then_its_calls(tmp_path_factory: pytest.TempPathFactory,
                                                              ) -> None:
    """Under Qwen 3.5's template the reply starts inside a reasoning block: the reasoning comes
    apart (`reasoning_content`; a budget of 3 tokens ends it), then the calls (its XML
    parameters), and neither reaches the content, streamed or not (the answer is made a call
    by a grammar, which holds the answer alone)."""
    template = Path(__file__).parent / "chat_templates" / "Qwen3.5-4B.jinja"
    server = Server("smollm2", "--chat-template-file", str(template), "--spec-type", "none",
                    home=tmp_path_factory.mktemp("home"))
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        written = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n"
                   "</tool_call>")
        asked = {"model": "smollm2", "messages": ASK, "tools": TOOLS, "temperature": 0, "max_tokens": 80,
                 "extra_body": {"grammar": f"root ::= {json.dumps(written)}", "reasoning_budget": 3}}
        whole = client.chat.completions.create(**asked).choices[0]
        reasoning = whole.message.model_extra["reasoning_content"]
        assert reasoning.strip() and not whole.message.content and whole.finish_reason == "tool_calls"
        assert [(c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls] == \
            [("get_weather", {"city": "Rome"})]
        with client.chat.completions.stream(**asked) as stream:
            events = list(stream)
            final = stream.get_final_completion().choices[0]
        assert not "".join(e.delta for e in events if e.type == "content.delta")
        thought = "".join(e.chunk.choices[0].delta.model_extra.get("reasoning_content") or ""
                          for e in events if e.type == "chunk" and e.chunk.choices)
        assert thought == reasoning
        assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == \
            [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    finally:
        assert server.stop() == 0, "".join(server.log)
