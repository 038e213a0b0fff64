"""`infer run --tools` (issue 33): on the embedded model under Qwen 3's template, a required
call is printed as JSON lines a script can dispatch, --json has the calls in OpenAI's shape,
and bad --tools values are one-line usage errors (exit 2)."""

from __future__ import annotations

import json

import jsonschema
from conftest import run_cli
from tiny_model import fixtures_dir

QWEN3 = fixtures_dir() / "chat-templates" / "Qwen-Qwen3-0.6B.jinja"
CITY = {"type": "string", "enum": ["Paris", "Rome", "Oslo"]}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                         "parameters": {"type": "object", "required": ["city"],
                                                        "properties": {"city": CITY}}}}


def test_a_required_call_is_printed_as_json_lines_and_in_json(smollm2, tmp_path, infer_home):
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([TOOL]))
    args = ["run", smollm2, "Weather in Paris?", "--chat-template-file", QWEN3, "--tools", f"@{tools}",
            "--tool-choice", "get_weather", "--temp", "0", "--think", "off", "-n", "200"]
    plain = run_cli(*args)
    assert plain.returncode == 0, plain.stderr
    lines = [json.loads(line) for line in plain.stdout.splitlines()]
    assert lines and all(call["name"] == "get_weather" for call in lines)
    for call in lines:
        jsonschema.validate(call["arguments"], TOOL["function"]["parameters"])
    result = json.loads(run_cli(*args, "--json").stdout)
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in result["tool_calls"]]
    assert calls == [(c["name"], c["arguments"]) for c in lines]
    assert result["text"] == "" and "<tool_call>" not in plain.stdout


def test_bad_tools_are_usage_errors(smollm2, infer_home):
    for args, words in ((["--tools", "[1]"], 'tools[0] must be an object of type "function"'),
                        (["--tools", "{"], "--tools is not valid JSON"),
                        (["--tool-choice", "required"], "--tool-choice needs --tools"),
                        (["--tools", json.dumps([TOOL]), "--tool-choice", "nope"], "not among the tools")):
        r = run_cli("run", smollm2, "Hi", *args)
        assert r.returncode == 2 and words in r.stderr and r.stderr.count("\n") == 1, (args, r.stderr)


def test_batch_lines_with_tools_have_tool_calls(smollm2, infer_home):
    """`infer batch` lines may carry tools, tool_choice and parallel_tool_calls, and histories
    with earlier calls and tool results: a required call comes back in `tool_calls` (valid for
    its schema), a line without tools as before, and a line with bad tools as an error object."""
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    earlier = {"id": "c1", "type": "function",
               "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    called = [*ask, {"role": "assistant", "content": None, "tool_calls": [earlier]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"sky": "clear"}'}]
    lines = [{"id": "call", "messages": ask, "tools": [TOOL], "tool_choice": "required",
              "parallel_tool_calls": False},
             {"id": "after", "messages": called, "tools": [TOOL], "tool_choice": "none", "max_tokens": 8},
             {"id": "plain", "prompt": "Hi", "max_tokens": 4},
             {"id": "bad", "prompt": "Hi", "tools": [{"type": "function", "function": {"name": "a b"}}]}]
    r = run_cli("batch", smollm2, "--chat-template-file", QWEN3, "--temp", "0", "--think", "off", "-n", "120",
                input="".join(json.dumps(line) + "\n" for line in lines))
    assert r.returncode == 2, r.stderr  # (one line failed)
    got = {x["id"]: x for x in map(json.loads, r.stdout.splitlines())}
    (call,) = got["call"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and got["call"]["finish_reason"] == "tool_calls"
    jsonschema.validate(json.loads(call["function"]["arguments"]), TOOL["function"]["parameters"])
    assert got["after"]["text"] and "tool_calls" not in got["after"]
    assert got["after"]["usage"]["prompt_tokens"] > got["plain"]["usage"]["prompt_tokens"]
    assert "tool_calls" not in got["plain"] and "tools[0].function.name" in got["bad"]["error"]


def test_a_template_that_knows_no_tools_calls_in_the_generic_form(smollm2, infer_home):
    """SmolLM2's own template knows no tools: the tools are described in the system message
    (--show-prompt shows them) and a required call comes in infer's generic JSON form, held to
    the grammar, and read back as a call; the conversation's next turn has that call in the
    text of its turn, as the form writes it."""
    args = ["run", smollm2, "Weather in Paris?", "--tools", json.dumps([TOOL]), "--temp", "0", "-n", "120"]
    shown = run_cli(*args, "--show-prompt")
    assert shown.returncode == 0 and '"name": "get_weather"' in shown.stdout
    assert '{"tool_calls": [' in shown.stdout
    r = run_cli(*args, "--tool-choice", "required", "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    (call,) = result["tool_calls"]
    assert result["finish_reason"] == "tool_calls" and result["text"] == ""
    jsonschema.validate(json.loads(call["function"]["arguments"]), TOOL["function"]["parameters"])
    after = run_cli("run", "-C", "Thanks.", "--tools", json.dumps([TOOL]), "--show-prompt")  # (its next turn)
    written = json.dumps({"tool_calls": [{"name": "get_weather",
                                          "arguments": json.loads(call["function"]["arguments"])}]})
    assert after.returncode == 0 and f"<|im_start|>assistant\n{written}<|im_end|>" in after.stdout
