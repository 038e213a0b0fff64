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
                        (["--tools", json.dumps([TOOL]), "--tool-choice", "nope"], "not among the tools"),
                        # (SmolLM2's own template writes no calls)
                        (["--tools", json.dumps([TOOL])], "writes no tool calls")):
        r = run_cli("run", smollm2, "Hi", *args)
        assert r.returncode == 2 and words in r.stderr and r.stderr.count("\n") == 1, (args, r.stderr)
