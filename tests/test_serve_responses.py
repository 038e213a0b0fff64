"""OpenAI's Responses API through `infer serve` (issue 35), driven by OpenAI's own client on
the embedded model under Qwen 3's template: the same greedy text as the chat API gives for the
same messages, streams (raw events and the client's `responses.stream`) that assemble to the
same response, `max_output_tokens` ending a response incomplete, a function call -> its output
-> a reply, `previous_response_id` continuing a stored conversation from the KV cache, GET and
DELETE of stored responses, `text.format`'s JSON schema, and OpenAI's error shape for bad
bodies. The stream's output items and the input items' translation are also checked without
a model."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from serve_helpers import Server

from infer.runtime.tool_stream import ArgumentsPiece, CallStarted
from infer.server.errors import ApiError
from infer.server.response_store import ResponseStore, Stored
from infer.server.responses import request
from infer.server.responses_reply import _Items

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.", "strict": True,
           "parameters": {"type": "object", "required": ["city"], "additionalProperties": False,
                          "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]}}}}
BRIEF, ASK = "Answer with one word.", "Say yes."  # (the embedded model answers "Yes." and stops)


@pytest.fixture
def server(qwen3_server: Server) -> Server:
    return qwen3_server


@pytest.fixture
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _items(response) -> list[dict]:
    """The output items without their ids (new in each response)."""
    drop = {"id", "call_id", "parsed_arguments"}
    return [item.model_dump(exclude=drop, exclude_none=True) for item in response.output]


def test_greedy_text_equals_the_chat_apis_and_streams_assemble_to_it(client: openai.OpenAI) -> None:
    asked = {"model": "smollm2", "instructions": BRIEF, "max_output_tokens": 8, "temperature": 0,
             "input": [{"role": "user", "content": [{"type": "input_text", "text": ASK}]}],
             "metadata": {"case": "greedy"}}
    whole = client.responses.create(**asked)
    chat = client.chat.completions.create(model="smollm2", max_tokens=8, temperature=0, messages=[
        {"role": "system", "content": BRIEF}, {"role": "user", "content": ASK}])
    assert whole.object == "response" and whole.id.startswith("resp_") and whole.status == "completed"
    assert whole.output_text == chat.choices[0].message.content and whole.output_text.strip()
    (message,) = whole.output
    assert message.type == "message" and message.id.startswith("msg_") and message.role == "assistant"
    assert whole.usage.input_tokens == chat.usage.prompt_tokens
    assert whole.usage.output_tokens == chat.usage.completion_tokens
    assert whole.usage.total_tokens == whole.usage.input_tokens + whole.usage.output_tokens
    assert whole.metadata == {"case": "greedy"} and whole.instructions == BRIEF
    assert whole.max_output_tokens == 8 and whole.temperature == 0 and whole.store is True
    events = list(client.responses.create(**asked, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == whole.output_text
    assert events[-1].response.output_text == whole.output_text
    with client.responses.stream(**asked) as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(texts) == final.output_text == whole.output_text
    assert _items(final) == _items(whole) and final.status == "completed"
    assert final.usage.output_tokens == whole.usage.output_tokens  # (its input_tokens_details: cached)


def test_max_output_tokens_ends_a_response_incomplete(client: openai.OpenAI) -> None:
    asked = {"model": "smollm2", "input": "Name three rivers.", "max_output_tokens": 4, "temperature": 0,
             "store": False}
    whole = client.responses.create(**asked)
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert whole.usage.output_tokens == 4 and whole.output[0].status == "incomplete"
    events = list(client.responses.create(**asked, stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.output_text == whole.output_text and whole.output_text
    with pytest.raises(openai.NotFoundError):  # (store: false)
        client.responses.retrieve(whole.id)


def test_a_function_call_then_its_output_then_a_reply(client: openai.OpenAI) -> None:
    asked = {"model": "smollm2", "input": "What is the weather in Paris?", "tools": [WEATHER],
             "tool_choice": "required", "parallel_tool_calls": False, "max_output_tokens": 40,
             "temperature": 0}
    whole = client.responses.create(**asked)
    assert whole.status == "completed"
    (call,) = whole.output  # (no message of white space before it)
    assert call.type == "function_call" and call.name == "get_weather" and call.id.startswith("fc_")
    assert call.call_id and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    with client.responses.stream(**asked) as stream:
        kinds = [e.type for e in stream]
        streamed = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds and "response.output_text.delta" not in kinds
    assert _items(streamed) == _items(whole)
    assert streamed.output[0].parsed_arguments == json.loads(call.arguments)  # (the client's strict tool)
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 C."}
    reply = client.responses.create(
        model="smollm2", input=[{"role": "user", "content": asked["input"]}, call.model_dump(), result],
        tools=[WEATHER], tool_choice="none", max_output_tokens=4, temperature=0)
    assert reply.output_text.strip() and [i.type for i in reply.output] == ["message"]
    again = client.responses.create(model="smollm2", input=[result], previous_response_id=whole.id,
                                    tools=[WEATHER], tool_choice="none", max_output_tokens=4, temperature=0)
    assert again.output_text == reply.output_text  # (the stored conversation is the one sent)


def test_previous_response_id_continues_from_the_kv_cache_and_the_store(server: Server,
                                                                       client: openai.OpenAI) -> None:
    first = client.responses.create(model="smollm2", instructions=BRIEF, input=ASK, max_output_tokens=8,
                                    temperature=0)
    second = client.responses.create(model="smollm2", input="Now say no.", previous_response_id=first.id,
                                     max_output_tokens=4, temperature=0)
    assert second.previous_response_id == first.id and second.instructions is None
    assert second.usage.input_tokens_details.cached_tokens > 0
    chat = client.chat.completions.create(model="smollm2", max_tokens=4, temperature=0, messages=[
        {"role": "user", "content": ASK}, {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Now say no."}])  # (the instructions are not carried over)
    assert second.output_text == chat.choices[0].message.content
    assert second.usage.input_tokens == chat.usage.prompt_tokens
    assert client.responses.retrieve(second.id).model_dump() == second.model_dump()
    gone = httpx.delete(f"{server.url}/v1/responses/{first.id}", timeout=30)
    assert gone.status_code == 200 and gone.json() == {"id": first.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model="smollm2", input="Again?", previous_response_id=first.id)
    assert missing.value.body["code"] == "previous_response_not_found"
    assert httpx.delete(f"{server.url}/v1/responses/{first.id}", timeout=30).status_code == 404


def test_text_format_gives_json_the_schema_validates(client: openai.OpenAI) -> None:
    schema = {"type": "object", "required": ["city"], "additionalProperties": False,
              "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]}}}
    r = client.responses.create(model="smollm2", input="Which city is the capital of France?", temperature=0,
                                max_output_tokens=12, text={"format": {"type": "json_schema", "name": "city",
                                                                       "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema"


USER = [{"role": "user", "content": "Hi"}]
# (body, status, the param, words in the message): OpenAI's error shape
HOSTILE = [
    ({"model": "smollm2"}, 400, "input", "Field required"),
    ({"model": "smollm2", "input": 7}, 400, "input", "string or a non-empty array"),
    ({"model": "smollm2", "input": []}, 400, "input", "non-empty array"),
    ({"model": "smollm2", "input": [{"role": "user", "content": [
        {"type": "input_image", "file_id": "file-1"}]}]},
     400, "input[0].content[0].file_id", "no Files API"),
    ({"model": "smollm2", "input": [{"role": "user", "content": [
        {"type": "input_file", "file_data": "AAAA"}]}]},
     400, "input[0].content[0]", "input_file part is not supported"),
    ({"model": "smollm2", "input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]},
     400, "input[0].content[0].image_url", "not a PNG, JPEG"),
    ({"model": "smollm2", "input": [{"type": "web_search_call", "id": "ws_1"}]}, 400, "input[0].type",
     "'web_search_call' is not supported"),
    ({"model": "smollm2", "input": [{"role": "tool", "content": "x"}]}, 400, "input[0].role", "role"),
    ({"model": "smollm2", "input": [{"type": "function_call_output", "output": "x"}]}, 400,
     "input[0].call_id", "call_id"),
    ({"model": "smollm2", "input": USER, "tools": [{"type": "web_search"}]}, 400, "tools[0]",
     "'web_search' tool is not supported"),
    ({"model": "smollm2", "input": USER, "tools": [WEATHER], "tool_choice": "sometimes"}, 400, "tool_choice",
     "tool_choice must be"),
    ({"model": "smollm2", "input": USER, "tools": [WEATHER],
      "tool_choice": {"type": "function", "name": "f"}}, 400, "tool_choice", "not among the tools"),
    ({"model": "smollm2", "input": USER, "text": {"format": {"type": "xml"}}}, 400, "text.format",
     "text.format must be"),
    ({"model": "smollm2", "input": USER, "text": {"format": {"type": "json_schema", "name": "x"}}}, 400,
     "text.format.schema", "schema"),
    ({"model": "smollm2", "input": USER, "max_output_tokens": 0}, 400, "max_output_tokens", "positive"),
    ({"model": "smollm2", "input": USER, "reasoning": {"effort": "extreme"}}, 400, "reasoning.effort",
     "reasoning.effort must be"),
    ({"model": "smollm2", "input": USER, "temperature": "hot"}, 400, "temperature", "temperature"),
    ({"model": "smollm2", "input": USER, "instructions": ["x"]}, 400, "instructions", "string"),
    ({"model": "smollm2", "input": USER, "background": True}, 400, "background", "not supported"),
    ({"model": "smollm2", "input": USER, "store": "yes"}, 400, "store", "boolean"),
    ({"model": "smollm2", "input": USER, "previous_response_id": "resp_nope"}, 404, "previous_response_id",
     "resp_nope"),
    ({"model": "no-such-model", "input": USER}, 404, None, "no-such-model"),
]


@pytest.mark.parametrize(("body", "status", "param", "words"), HOSTILE,
                         ids=[str(i) for i in range(len(HOSTILE))])
def test_bad_bodies_get_openais_error_shape(server: Server, body: dict, status: int, param: str | None,
                                            words: str) -> None:
    r = httpx.post(server.url + "/v1/responses", json=body, timeout=60)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and words in error["message"], error
    assert param is None or error["param"] == param, error


def test_get_and_delete_of_an_unknown_response_are_404(server: Server) -> None:
    for method in ("GET", "DELETE"):
        r = httpx.request(method, server.url + "/v1/responses/resp_unknown", timeout=30)
        assert r.status_code == 404 and r.json()["error"]["code"] == "response_not_found"


# -- without a model ------------------------------------------------------------------------------

def _events(chunks: list[bytes]) -> list[dict]:
    out = []
    for chunk in chunks:
        kind, data = chunk.decode().strip().split("\n")
        out.append(json.loads(data.removeprefix("data: ")))
        assert kind == "event: " + out[-1]["type"]
    return out


def test_streamed_items_hold_white_space_back_until_text_comes() -> None:
    items = _Items()
    call = [CallStarted(0, "call_1", "get_weather"), ArgumentsPiece(0, '{"city": '),
            ArgumentsPiece(0, '"Paris"}')]
    chunks = items.add("Let me think.", "", []) + items.add("", "\n\n", []) + items.add("", "", call)
    chunks += items.finish("completed")
    events = _events(chunks)
    assert "response.output_text.delta" not in [e["type"] for e in events]  # (the white space never sent)
    assert [i["type"] for i in items.output] == ["reasoning", "function_call"]
    assert items.output[0]["content"] == [{"type": "reasoning_text", "text": "Let me think."}]
    assert items.output[1]["arguments"] == '{"city": "Paris"}' and items.output[1]["call_id"] == "call_1"
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert done[0]["arguments"] == '{"city": "Paris"}' and done[0]["output_index"] == 1
    text = _Items()
    chunks = text.add("", "  ", []) + text.add("", "Hi", []) + text.finish("incomplete")
    deltas = [e["delta"] for e in _events(chunks) if e["type"] == "response.output_text.delta"]
    assert deltas == ["  Hi"] and text.output[0]["status"] == "incomplete"
    empty = _Items()
    _events(empty.finish("completed"))
    assert empty.output[0]["content"][0]["text"] == ""  # (a message, if empty, as the whole response has)


def test_input_items_become_the_chat_messages() -> None:
    store = ResponseStore(limit=2)
    earlier = Stored({"id": "resp_a"}, ({"role": "user", "content": "Hi"},
                                        {"role": "assistant", "content": "Hello"}))
    store.put(earlier)
    body = {"model": "m", "instructions": "Be brief.", "previous_response_id": "resp_a", "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Rules."}]},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "Hm."}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{\"x\": 1}"},
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "one"}]},
        {"type": "function_call_output", "call_id": "c2", "output": "two"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Done.", "annotations": []}]}]}
    asked = request(body, store)
    assert asked.chat["messages"] == [
        {"role": "system", "content": "Be brief."}, *earlier.messages,
        {"role": "system", "content": "Rules."},
        {"role": "assistant", "content": "", "reasoning_content": "Hm.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{\"x\": 1}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
        {"role": "assistant", "content": "Done."}]
    assert asked.previous is earlier and asked.messages == tuple(asked.chat["messages"][3:])
    store.put(Stored({"id": "resp_b"}, ()))
    store.put(Stored({"id": "resp_c"}, ()))  # (over the limit: the oldest goes)
    with pytest.raises(ApiError) as gone:
        request(body, store)
    assert gone.value.status == 404 and gone.value.code == "previous_response_not_found"
