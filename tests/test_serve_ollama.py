"""Ollama's native API through `infer serve` (issue 35), driven by the `ollama` package as
its users' programs do, on the embedded model under Qwen 3's template: /api/chat and
/api/generate give the chat API's greedy text (which tests/test_serve.py holds to
`infer run`'s), streamed NDJSON adds up to it, options map to the request table, tool calls
come back with arguments as objects and their results go back in, `raw` sends the prompt as
it is, the listings name what is served, and errors have Ollama's shape."""

from __future__ import annotations

import base64
import json

import httpx
import jsonschema
import ollama
import openai
import pytest
from serve_helpers import Server
from tiny_vision import png_bytes

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]}}}}}
ASK = [{"role": "user", "content": "Name three rivers."}]
GREEDY = {"temperature": 0, "num_predict": 16}


@pytest.fixture
def server(qwen3_server: Server) -> Server:
    return qwen3_server


@pytest.fixture
def client(server: Server) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=120)


def _chat_api(server: Server, messages: list[dict], **extra) -> openai.types.chat.ChatCompletion:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    return client.chat.completions.create(model="smollm2", messages=messages, temperature=0, max_tokens=16,
                                          extra_body={"chat_template_kwargs": {"enable_thinking": False}},
                                          **extra)


def test_chat_and_its_stream_give_the_chat_apis_text(server: Server, client: ollama.Client) -> None:
    reply = client.chat(model="smollm2", messages=ASK, options=GREEDY, think=False)
    same = _chat_api(server, ASK)
    assert reply.message.role == "assistant" and reply.message.content == same.choices[0].message.content
    assert reply.done and reply.done_reason == "length" and reply.eval_count == 16
    assert reply.prompt_eval_count == same.usage.prompt_tokens and reply.eval_duration > 0
    parts = list(client.chat(model="smollm2", messages=ASK, options=GREEDY, think=False, stream=True))
    assert len(parts) > 2 and not any(p.done for p in parts[:-1]) and parts[-1].done
    assert "".join(p.message.content or "" for p in parts) == reply.message.content


def test_generate_takes_system_and_raw_and_stop(server: Server, client: ollama.Client) -> None:
    done = client.generate(model="smollm2", prompt="Name three rivers.", system="Answer briefly.",
                           options=GREEDY, think=False)
    same = _chat_api(server, [{"role": "system", "content": "Answer briefly."}, *ASK])
    assert done.response == same.choices[0].message.content
    raw = client.generate(model="smollm2", prompt="The capital of France is", raw=True, options=GREEDY)
    completion = openai.OpenAI(base_url=server.url + "/v1", api_key="x").completions.create(
        model="smollm2", prompt="The capital of France is", temperature=0, max_tokens=16)
    assert raw.response == completion.choices[0].text and raw.response
    words = raw.response.split()
    stopped = client.generate(model="smollm2", prompt="The capital of France is", raw=True,
                              options={**GREEDY, "stop": [words[len(words) // 2]]})
    assert stopped.done_reason == "stop" and len(stopped.response) < len(raw.response)


def test_a_tool_call_then_its_result_then_a_reply(server: Server, client: ollama.Client) -> None:
    """Ollama's API has no tool_choice (Ollama ignores one); infer honours OpenAI's (and
    parallel_tool_calls), so the call is sure: its arguments come back as an object, streamed
    as whole, and the tool's result goes back in by the function's name."""
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    body = {"model": "smollm2", "messages": ask, "tools": [WEATHER], "tool_choice": "required",
            "parallel_tool_calls": False, "think": False,
            "options": {"temperature": 0, "num_predict": 60}}
    whole = httpx.post(server.url + "/api/chat", json={**body, "stream": False}, timeout=120).json()
    (call,) = whole["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    jsonschema.validate(call["function"]["arguments"], WEATHER["function"]["parameters"])
    with httpx.stream("POST", server.url + "/api/chat", json=body, timeout=120) as r:
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert [c for line in lines for c in line["message"].get("tool_calls", [])] == [call]
    assert lines[-1]["done"] and not whole["message"]["content"]
    result = {"role": "tool", "content": "Sunny, 24 C.", "tool_name": "get_weather"}
    history = [*ask, whole["message"], result]
    after = client.chat(model="smollm2", messages=history, tools=[WEATHER], options=GREEDY, think=False)
    assert after.message.content and not after.message.tool_calls


def test_format_holds_the_reply_to_a_schema(client: ollama.Client) -> None:
    schema = {"type": "object", "required": ["river"],
              "properties": {"river": {"type": "string", "maxLength": 20}}}
    reply = client.chat(model="smollm2", messages=ASK, format=schema, think=False,
                        options={"temperature": 0, "num_predict": 40})
    jsonschema.validate(json.loads(reply.message.content), schema)


def test_listings_name_what_is_served(server: Server, client: ollama.Client) -> None:
    client.chat(model="smollm2", messages=ASK, options={"num_predict": 1})
    assert "smollm2" in [m.model for m in client.list().models]
    (running,) = client.ps().models
    assert running.model == "smollm2" and running.size > 10_000_000
    shown = client.show("smollm2")
    assert "tools" in shown.capabilities and "thinking" in shown.capabilities  # (Qwen 3's template thinks)
    assert "<|im_start|>" in shown.template
    assert httpx.get(server.url + "/api/version").json()["version"]


PNG = base64.b64encode(png_bytes(8, 8)).decode()
HOSTILE = [
    ("/api/chat", {"model": "smollm2"}, 400, "messages"),
    ("/api/chat", {"model": "smollm2", "messages": ASK, "options": []}, 400, "options"),
    ("/api/chat", {"model": "smollm2", "messages": ASK, "options": {"temperature": "hot"}}, 400,
     "temperature"),
    ("/api/chat", {"model": "smollm2", "messages": [{"role": "user", "content": "x", "images": ["AAAA"]}]},
     400, "not a PNG, JPEG"),
    ("/api/chat", {"model": "smollm2", "messages": [{"role": "user", "content": "x", "images": [PNG]}]},
     400, "reads no image"),  # (served without a projector)
    ("/api/generate", {"model": "smollm2", "prompt": "x", "images": [PNG]}, 400, "reads no image"),
    ("/api/chat", {"model": "smollm2", "messages": [{"role": "user", "content": "x", "images": "AAAA"}]},
     400, "images must be an array"),
    ("/api/chat", {"model": "smollm2", "messages": ASK, "format": "yaml"}, 400, "format"),
    ("/api/chat", {"model": "smollm2", "messages": [{"role": "tool", "content": "x"}]}, 400, "tool"),
    ("/api/chat", {"model": "no-such-model", "messages": ASK}, 404, "no-such-model"),
    ("/api/generate", {"model": "smollm2", "prompt": "x", "template": "{{ .Prompt }}"}, 400, "template"),
    ("/api/generate", {"model": "smollm2", "prompt": "def f(", "suffix": "return 1"}, 400, "suffix"),
    ("/api/generate", {"model": "smollm2", "prompt": 7}, 400, "prompt"),
    ("/api/generate", {"prompt": "x"}, 400, "model"),
    ("/api/show", {}, 400, "model"),
]


@pytest.mark.parametrize(("path", "body", "status", "words"), HOSTILE,
                         ids=[str(i) for i in range(len(HOSTILE))])
def test_bad_bodies_get_ollamas_error_shape(server: Server, path: str, body: dict, status: int,
                                            words: str) -> None:
    r = httpx.post(server.url + path, json={"stream": False, **body}, timeout=60)
    assert r.status_code == status, r.text
    error = r.json()
    assert set(error) == {"error"} and words in error["error"], error
