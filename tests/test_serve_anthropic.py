"""Anthropic's Messages API through `infer serve` (issue 35), driven by Anthropic's own client
on the embedded model: the same greedy text as the chat API gives for the same messages (which
tests/test_serve.py holds to `infer run`'s), streams that assemble to the same message, stop
reasons, tool_use -> tool_result -> reply under Qwen 3's template, thinking blocks under
DeepSeek R1's, count_tokens, the x-api-key header, and Anthropic's error shape for bad bodies."""

from __future__ import annotations

import base64
import json

import anthropic
import httpx
import jsonschema
import openai
import pytest
from serve_helpers import Server
from tiny_model import fixtures_dir
from tiny_vision import png_bytes

QWEN3 = fixtures_dir() / "chat-templates" / "Qwen-Qwen3-0.6B.jinja"
R1 = fixtures_dir() / "chat-templates" / "llama-cpp-deepseek-r1.jinja"
KEY = "sk-local-test"
WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "required": ["city"], "properties": {
               "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]}}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# (Anthropic's client of 2026 has no sampling arguments: they go as extra body fields, as
# other servers' clients send them.)
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Server:
    s = Server("smollm2", "-np", "2", "--chat-template-file", str(QWEN3), "--spec-type", "none",
               "--api-key", KEY, home=tmp_path_factory.mktemp("home"))
    yield s
    assert s.stop() == 0, "".join(s.log)


@pytest.fixture
def client(server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=120)


def _text(message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def test_greedy_text_equals_the_chat_apis_and_streams_assemble_to_it(server: Server,
                                                                     client: anthropic.Anthropic) -> None:
    asked = {"model": "smollm2", "max_tokens": 24, "extra_body": GREEDY, "system": "Answer briefly.",
             "messages": [{"role": "user", "content": [{"type": "text", "text": "Name three rivers."}]}]}
    whole = client.messages.create(**asked)
    same = [{"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "Name three rivers."}]
    chat = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0).chat.completions.create(
        model="smollm2", max_tokens=24, temperature=0, messages=same)
    assert whole.type == "message" and whole.role == "assistant" and whole.id.startswith("msg_")
    assert _text(whole) == chat.choices[0].message.content and _text(whole)
    assert whole.stop_reason == "max_tokens" and whole.usage.output_tokens == 24
    assert whole.usage.input_tokens + whole.usage.cache_read_input_tokens == chat.usage.prompt_tokens
    with client.messages.stream(**asked) as stream:
        pieces = list(stream.text_stream)
        streamed = stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == _text(whole) == _text(streamed)
    assert streamed.stop_reason == "max_tokens" and streamed.usage.output_tokens == 24
    counted = client.messages.count_tokens(model="smollm2", system=asked["system"],
                                           messages=asked["messages"])
    assert counted.input_tokens == chat.usage.prompt_tokens


def test_a_stop_sequence_is_named_as_the_reason(client: anthropic.Anthropic) -> None:
    asked = {"model": "smollm2", "max_tokens": 40, "extra_body": GREEDY,
             "messages": [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]}
    free = _text(client.messages.create(**asked))
    words = free.split()
    assert len(words) > 6, free
    stop = words[len(words) // 2]  # (a word the reply surely writes)
    ended = client.messages.create(**asked, stop_sequences=["never written", stop])
    assert ended.stop_reason == "stop_sequence" and ended.stop_sequence == stop
    assert _text(ended) == free[:free.index(stop)]


def test_max_tokens_above_the_context_caps_the_reply(server: Server, client: anthropic.Anthropic) -> None:
    """Anthropic's clients send a max_tokens far above a local model's context (Claude Code:
    32,000): it caps the reply, which ends with the context at the latest, where OpenAI's
    chat API (whose max_tokens must fit, as OpenAI's does) refuses the same request."""
    ask = [{"role": "user", "content": "Say yes."}]
    reply = client.messages.create(model="smollm2", max_tokens=1_000_000, messages=ask, extra_body=GREEDY)
    assert reply.stop_reason == "end_turn" and _text(reply).strip(), reply
    r = httpx.post(server.url + "/v1/chat/completions", headers={"x-api-key": KEY}, timeout=60,
                   json={"model": "smollm2", "max_tokens": 1_000_000, "messages": ask})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text


def test_a_tool_use_then_its_result_then_a_reply(client: anthropic.Anthropic) -> None:
    asked = {"model": "smollm2", "max_tokens": 60, "extra_body": GREEDY, "messages": ASK, "tools": [WEATHER],
             "tool_choice": {"type": "any", "disable_parallel_tool_use": True}}
    whole = client.messages.create(**asked)
    assert whole.stop_reason == "tool_use"
    (use,) = [b for b in whole.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.id
    jsonschema.validate(use.input, WEATHER["input_schema"])
    assert not [b for b in whole.content if b.type == "text"]  # nothing of the call as text
    with client.messages.stream(**asked) as stream:
        kinds = [e.type for e in stream]
        streamed = stream.get_final_message()
    assert "content_block_start" in kinds and kinds[-1] == "message_stop"
    (again,) = [b for b in streamed.content if b.type == "tool_use"]
    assert (again.name, again.input) == (use.name, use.input) and streamed.stop_reason == "tool_use"
    history = [*ASK, {"role": "assistant", "content": [b.model_dump() for b in whole.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                             "content": [{"type": "text", "text": "Sunny, 24 C."}]}]}]
    reply = client.messages.create(model="smollm2", max_tokens=12, extra_body=GREEDY, messages=history,
                                   tools=[WEATHER], tool_choice={"type": "none"})
    assert reply.stop_reason in ("end_turn", "max_tokens") and _text(reply).strip()
    assert not [b for b in reply.content if b.type == "tool_use"]


def test_thinking_blocks_come_apart_from_the_text(tmp_path) -> None:
    """Under DeepSeek R1's template the embedded model thinks (it never closes the block
    itself): the budget closes it, and the thinking block and the text are what the chat
    API returns as reasoning_content and content."""
    s = Server("smollm2", "-np", "1", "--chat-template-file", str(R1), "--spec-type", "none",
               home=tmp_path / "home")
    try:
        client = anthropic.Anthropic(base_url=s.url, api_key="unused", max_retries=0, timeout=120)
        asked = {"model": "smollm2", "max_tokens": 20, "extra_body": GREEDY,
                 "messages": [{"role": "user", "content": "What is 2 + 2?"}],
                 "thinking": {"type": "enabled", "budget_tokens": 6}}
        whole = client.messages.create(**asked)
        chat = httpx.post(s.url + "/v1/chat/completions", timeout=120, json={
            "model": "smollm2", "max_tokens": 20, "temperature": 0, "messages": asked["messages"],
            "think": True, "reasoning_budget": 6}).json()["choices"][0]["message"]
        thinking = [b.thinking for b in whole.content if b.type == "thinking"]
        assert thinking == [chat["reasoning_content"]] and thinking[0].strip()
        assert _text(whole) == chat["content"]
        assert whole.content[0].type == "thinking"
        with client.messages.stream(**asked) as stream:
            streamed = stream.get_final_message()
        assert [b.model_dump(exclude={"signature"}) for b in streamed.content] == \
            [b.model_dump(exclude={"signature"}) for b in whole.content]
    finally:
        assert s.stop() == 0, "".join(s.log)


PNG = base64.b64encode(png_bytes(8, 8)).decode()

# (body, status, words in the message): Anthropic's shape, {"type": "error", "error": {...}}
HOSTILE = [
    ({"model": "smollm2", "messages": ASK}, 400, "max_tokens"),
    ({"model": "smollm2", "max_tokens": 8, "messages": []}, 400, "messages"),
    ({"model": "smollm2", "max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}, 400,
     "a user or assistant message"),
    ({"model": "smollm2", "max_tokens": 8, "messages": [{"role": "bot", "content": "x"}]}, 400, "role"),
    ({"model": "smollm2", "max_tokens": 8, "messages": [*ASK, {"role": "system", "content": 3}]}, 400,
     "messages.1.content"),
    ({"model": "smollm2", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]},
     400, "not a PNG, JPEG"),
    ({"model": "smollm2", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}]}]},
     400, "reads no image"),  # (served without a projector)
    ({"model": "smollm2", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url"}}]}]},
     400, "or a url source (type, url)"),
    ({"model": "smollm2", "max_tokens": 8, "messages": ASK, "tools": [{"type": "web_search_20250305",
                                                                       "name": "web_search"}]},
     400, "server tool"),
    ({"model": "smollm2", "max_tokens": 8, "messages": ASK, "tool_choice": {"type": "sometimes"}},
     400, "tool_choice"),
    ({"model": "smollm2", "max_tokens": 8, "messages": ASK, "thinking": {"type": "enabled",
                                                                         "budget_tokens": -1}},
     400, "budget_tokens"),
    ({"model": "smollm2", "max_tokens": 0, "messages": ASK}, 400, "max_tokens"),
    ({"model": "smollm2", "max_tokens": 8, "messages": ASK, "temperature": "hot"}, 400, "temperature"),
    ({"model": "smollm2", "max_tokens": 8, "messages": ASK, "stop_sequences": "END"}, 400, "stop_sequences"),
    ({"model": "smollm2", "max_tokens": 8, "system": 7, "messages": ASK}, 400, "system"),
    ({"model": "smollm2", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "content": "x"}]}]}, 400, "tool_use_id"),
    ({"model": "no-such-model", "max_tokens": 8, "messages": ASK}, 404, "no-such-model"),
    ({"max_tokens": 8, "messages": ASK}, 400, "model"),
]


@pytest.mark.parametrize(("body", "status", "words"), HOSTILE, ids=[str(i) for i in range(len(HOSTILE))])
def test_bad_bodies_get_anthropics_error_shape(server: Server, body: dict, status: int, words: str) -> None:
    r = httpx.post(server.url + "/v1/messages", json=body, headers={"x-api-key": KEY}, timeout=60)
    assert r.status_code == status, r.text
    error = r.json()
    assert error["type"] == "error" and words in error["error"]["message"], error
    assert error["error"]["type"] == ("not_found_error" if status == 404 else "invalid_request_error")


def test_the_api_key_goes_in_x_api_key_or_the_bearer_header(server: Server) -> None:
    wrong = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as refused:
        wrong.messages.create(model="smollm2", max_tokens=4, messages=ASK)
    assert refused.value.body["error"]["type"] == "authentication_error"
    r = httpx.post(server.url + "/v1/messages/count_tokens", headers={"Authorization": f"Bearer {KEY}"},
                   json={"model": "smollm2", "messages": ASK}, timeout=60)
    assert r.status_code == 200 and r.json()["input_tokens"] > 5
    assert httpx.post(server.url + "/v1/messages", content=b"{", timeout=60,
                      headers={"x-api-key": KEY}).json()["error"]["type"] == "invalid_request_error"
    not_allowed = httpx.get(server.url + "/v1/messages", headers={"x-api-key": KEY})
    assert not_allowed.status_code == 405 and json.loads(not_allowed.text)["type"] == "error"
