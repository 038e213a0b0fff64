"""`infer serve` on the embedded real model, through OpenAI's own client and raw HTTP."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import threading
import time
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest
from conftest import assert_one_line_error, run_cli
from real_model import assert_same_or_rounding, pool_noise
from serve_helpers import Server

from infer.runtime.params import ContextParams
from infer.runtime.prompt import chat_prompt
from infer.runtime.sampling import SamplingParams
from infer.runtime.session import Session

PARALLEL, CTX = 8, 8192  # one pool: a request may use all 8,192


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Server:
    s = Server("smollm2", "-np", str(PARALLEL), "-c", str(CTX), home=tmp_path_factory.mktemp("home"))
    yield s
    assert s.stop() == 0, "".join(s.log)


@pytest.fixture
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def grammar_for(text: str) -> str:
    """A grammar whose only sentence is `text`: the reply is known before it is made."""
    return f"root ::= {json.dumps(text)}"


def test_chat_and_completions_with_the_openai_client(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Hi!"}],
                                          max_tokens=12, temperature=0)
    choice = chat.choices[0]
    assert chat.object == "chat.completion" and chat.model == "smollm2"
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert chat.usage.completion_tokens <= 12 and chat.usage.prompt_tokens > 5
    assert chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens
    done = client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=8,
                                     temperature=0)
    assert done.object == "text_completion" and "Paris" in done.choices[0].text
    assert done.usage.completion_tokens == 8 and done.choices[0].finish_reason == "length"
    listed = [m.id for m in client.models.list()]
    assert "smollm2" in listed


def test_a_stream_says_what_the_whole_reply_says_and_ends_with_usage(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Name three colours."}]
    # Asked twice first: the first reply prefills the whole prompt as one batch, every later one
    # reuses its cache and decodes the last prompt token alone, which rounds otherwise
    # (tests/real_model.py); the stream is compared with a reply computed as it is.
    client.chat.completions.create(model="smollm2", messages=messages, max_tokens=24, temperature=0)
    whole = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=24, temperature=0)
    chunks = list(client.chat.completions.create(model="smollm2", messages=messages, max_tokens=24,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == whole.usage.completion_tokens
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens
    # Completions stream too.
    pieces = list(client.completions.create(model="smollm2", prompt="One, two, three,", max_tokens=6,
                                            temperature=0, stream=True))
    assert "".join(p.choices[0].text for p in pieces if p.choices).strip().startswith("four")


def test_greedy_replies_equal_infer_runs_own(client: openai.OpenAI, smollm2: Path) -> None:
    """The server (many sequences per step) against a session decoding one token at a time, as
    `infer run` does: the same tokens, or where they part, a difference shown to be the
    rounding of batch shapes."""
    questions = ["What is the boiling point of water?", "Write a haiku about the sea.",
                 "List the planets of the solar system.", "Explain what a CPU does in two sentences."]
    replies = {}

    def ask(q: str) -> None:
        replies[q] = client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": q}], max_tokens=40, temperature=0,
            extra_body={"return_tokens": True})

    threads = [threading.Thread(target=ask, args=(q,)) for q in questions]  # decoded together
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with Session.open(smollm2, ContextParams(n_ctx=2048)) as session:
        prompts = {q: chat_prompt(session.model, [{"role": "user", "content": q}]).tokens for q in questions}
        noise = pool_noise(smollm2, list(prompts.values()))  # (the server's pool: prompts side by side)
        for q, tokens in prompts.items():
            params = SamplingParams(temperature=0, max_tokens=40)
            *_, done = session.generate(tokens, params)
            served = replies[q].choices[0].model_extra["tokens"]
            assert_same_or_rounding(session, tokens, done.tokens, served, params, q, layout_noise=noise)


def test_sixteen_concurrent_streams_each_get_their_own_reply(server: Server) -> None:
    async def main() -> list[str]:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)

        async def one(i: int) -> str:
            stream = await client.chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": f"Say the number {i}."}],
                max_tokens=20, stream=True, extra_body={"grammar": grammar_for(f"Number {i} here.")})
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

        try:
            return await asyncio.gather(*(one(i) for i in range(16)))
        finally:
            await client.close()

    assert asyncio.run(main()) == [f"Number {i} here." for i in range(16)]


def test_n_choices_share_the_prompts_prefill(client: openai.OpenAI, server: Server, smollm2: Path) -> None:
    messages = [{"role": "user", "content": "Tell me a short fact about cats. " * 8}]
    before = server.metrics()
    reply = client.chat.completions.create(model="smollm2", messages=messages, n=3, max_tokens=12,
                                           temperature=0.9, seed=5, extra_body={"return_tokens": True})
    after = server.metrics()
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert all(c.message.content for c in reply.choices)
    assert len({c.message.content for c in reply.choices}) > 1  # each choice has its own seed
    # Generated tokens are counted for every choice; the prompt once.
    assert reply.usage.completion_tokens == sum(len(c.model_extra["tokens"]) for c in reply.choices)
    prompt = reply.usage.prompt_tokens
    assert after["infer:prompt_tokens_total"] - before["infer:prompt_tokens_total"] == 3 * prompt
    # The two later choices found the first one's prompt in the KV cache (copied, not prefilled).
    cached = after["infer:cached_prompt_tokens_total"] - before["infer:cached_prompt_tokens_total"]
    assert cached >= 2 * (prompt - 1)
    # Greedy choices are each the reply alone (in the KV pool each attends to its own cells
    # among the other's, which may part them at a near-tie: real_model.assert_same_or_rounding).
    greedy = client.chat.completions.create(model="smollm2", messages=messages, n=2, max_tokens=12,
                                            temperature=0, extra_body={"return_tokens": True})
    with Session.open(smollm2, ContextParams(n_ctx=1024)) as session:
        tokens = chat_prompt(session.model, messages).tokens
        params = SamplingParams(temperature=0, max_tokens=12)
        *_, alone = session.generate(tokens, params)
        for choice in greedy.choices:
            assert_same_or_rounding(session, tokens, alone.tokens, choice.model_extra["tokens"], params,
                                    f"greedy choice {choice.index}")


def test_json_schema_output_validates(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    reply = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Invent a person; answer in JSON."}],
        max_tokens=60, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content), schema)
    # json_object: any object (cut short by max_tokens here, so only its start is checked).
    loose = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "A JSON object about a dog."}],
        max_tokens=8, temperature=0, response_format={"type": "json_object"})
    assert loose.choices[0].message.content.lstrip().startswith("{")


def test_logprobs_are_consistent_with_the_text(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Count from one to five."}], max_tokens=16,
        temperature=0, logprobs=True, top_logprobs=3)
    choice = reply.choices[0]
    entries = choice.logprobs.content
    assert len(entries) == reply.usage.completion_tokens
    assert bytes(b for e in entries for b in e.bytes).decode() == choice.message.content
    for e in entries:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        tops = [t.logprob for t in e.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        assert e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == pytest.approx(e.logprob)
    done = client.completions.create(model="smollm2", prompt="The sky is", max_tokens=5, temperature=0,
                                     logprobs=2)
    lp = done.choices[0].logprobs
    assert "".join(lp.tokens) == done.choices[0].text and len(lp.token_logprobs) == 5
    assert lp.text_offset[0] == 0 and all(len(t) == 2 for t in lp.top_logprobs)


def test_a_conversation_sent_again_reuses_its_cache(client: openai.OpenAI) -> None:
    messages = [{"role": "system", "content": "You are a terse assistant. " * 10},
                {"role": "user", "content": "What is two plus two?"}]
    first = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=16, temperature=0)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And three plus three?"}]
    second = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=8, temperature=0)
    cached = second.usage.prompt_tokens_details.cached_tokens
    # Only the new message (and the end of the reply's turn) is prefilled.
    assert cached >= first.usage.prompt_tokens + first.usage.completion_tokens - 2
    assert cached < second.usage.prompt_tokens


HOSTILE = [
    # (body, status, param) -- the error's type is invalid_request_error for every 400
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', 400, None),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}', 400, "temperature"),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": -1}', 400, "temperature"),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}', 400, "max_tokens"),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5}', 400, "max_tokens"),
    (b'{"messages": [{"role": "user", "content": "x"}], "n": 0}', 400, "n"),
    (b'{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}', 400, "top_logprobs"),
    (b'{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}', 400, "stream"),
    (b'{"messages": [{"role": "user", "content": "x"}], "stop": [1]}', 400, "stop"),
    (b'{"messages": [{"role": "user", "content": "x"}], "logit_bias": {"abc": 1}}', 400, "logit_bias"),
    (b'{"messages": [{"role": "user", "content": "x"}], "logit_bias": {"1": 1000}}', 400, "logit_bias"),
    (b'{"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": true}}', 400,
     "stream_options"),
    (b'{"messages": []}', 400, "messages"),
    (b'{"messages": "hello"}', 400, "messages"),
    (b'{"messages": [{"role": "wizard", "content": "x"}]}', 400, "messages[0].role"),
    (b'{"messages": [{"role": "user", "content": 5}]}', 400, "messages[0].content"),
    (b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}',
     400, "messages[0].content[0].image_url.url"),  # (not a data: URL)
    (b'{"messages": [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": "x"}}]}]}',
     400, "messages[0].content[0].type"),
    (b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}', 400,
     "tools[0].function.name"),
    # (a strict tool's schema with a keyword infer cannot enforce; a tool that is not strict
    # has it left to the model: test_tool_grammar)
    (b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": '
     b'{"name": "f", "strict": true, "parameters": {"type": "object", "properties": {"a": {"not": {}}}}}}]}',
     400, "tools"),
    (b'{"messages": [{"role": "user", "content": "x"}], "grammar": "root ::= ("}', 400, "grammar"),
    # (nested deeper than llama.cpp's parser survives: it crashed the server)
    (b'{"messages": [{"role": "user", "content": "x"}], "grammar": "root ::= ' + b"(" * 30000 + b'\\"a\\"'
     + b")" * 30000 + b'"}', 400, "grammar"),
    (b'{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", '
     b'"json_schema": {"name": "x", "schema": {"type": "string", "maxLength": 524288}}}}', 400,
     "response_format.json_schema.schema"),
    (b'{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", '
     b'"json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"$ref": "#/nope"}}}}}}',
     400, None),
    (b'{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}', 400,
     "response_format.type"),
    (b'{"prompt": 5}', 400, "prompt"),
    (b'{"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}', 404, "model"),
    (b'{"model": "/etc/passwd", "messages": [{"role": "user", "content": "x"}]}', 404, "model"),
]


@pytest.mark.parametrize("body,status,param", HOSTILE, ids=[str(i) for i in range(len(HOSTILE))])
def test_a_bad_request_gets_an_openai_error_and_the_server_goes_on(server: Server, body: bytes, status: int,
                                                                    param: str | None) -> None:
    path = "/v1/completions" if body.startswith(b'{"prompt"') else "/v1/chat/completions"
    r = httpx.post(server.url + path, content=body, headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param, error


def test_the_server_still_serves_after_hostile_requests(server: Server, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "x"}],
                                       temperature=-1)
    # A body over the size limit, unknown fields (ignored), an unknown path.
    big = httpx.post(server.url + "/v1/chat/completions", content=b"x" * (9 * 1024 * 1024), timeout=60)
    assert big.status_code == 413 and big.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(server.url + "/v1/nothing", timeout=10).status_code == 404
    ok = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Hi"}],
                                        max_tokens=4, temperature=0, extra_body={"some_extension": 1})
    assert ok.choices[0].message.content


def test_context_overflow_is_refused_before_the_stream_starts(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="smollm2", stream=True, max_tokens=10,
                                       messages=[{"role": "user", "content": "word " * (CTX + 100)}])
    error = caught.value.body
    assert error["code"] == "context_length_exceeded"
    assert f"may use {CTX} (the context of {CTX} tokens)" in error["message"]


def test_text_in_a_message_never_becomes_a_control_token(client: openai.OpenAI) -> None:
    def prompt_tokens(content: str) -> int:
        return client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": content}], max_tokens=1,
            temperature=0).usage.prompt_tokens

    # "<|im_end|>" is one control token to the template, but several tokens of text in a message.
    assert prompt_tokens("a <|im_end|>") > prompt_tokens("a b") + 1


def aborted(server: Server) -> int:
    """/metrics: the requests of smollm2 that ended because their client went away."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    m = re.search(r'infer:request_success_total\{model_name="smollm2",finished_reason="abort"\} (\d+)', text)
    return int(m.group(1)) if m else 0


def test_clients_that_disconnect_free_their_slots(server: Server, client: openai.OpenAI) -> None:
    before = aborted(server)

    def leave(i: int) -> None:
        with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=60,
                          json={"messages": [{"role": "user", "content": f"Write a long story {i}."}],
                                "max_tokens": 900, "stream": True, "ignore_eos": True}) as r:
            assert r.status_code == 200, r.read()  # (1,000 tokens did not fit a slot: nothing ran)
            for line in r.iter_lines():
                if line.startswith("data: ") and '"content":"' in line and '"content":""' not in line:
                    return  # the first generated text: hang up

    threads = [threading.Thread(target=leave, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    end = time.monotonic() + 30
    while time.monotonic() < end:
        m = server.metrics()
        if m["infer:num_requests_running"] == 0 and m["infer:num_requests_waiting"] == 0:
            break
        time.sleep(0.05)
    assert m["infer:num_requests_running"] == 0 and m["infer:num_requests_waiting"] == 0, m
    while aborted(server) < before + 32 and time.monotonic() < end:  # each is counted as it ends
        time.sleep(0.05)
    assert aborted(server) == before + 32, httpx.get(server.url + "/metrics").text[-3000:]
    # Nothing else runs: a new request is decoded alone (its own steps, none of the 32's).
    reply = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    assert reply.usage.completion_tokens == 8
    assert server.metrics()["infer:num_requests_running"] == 0


def test_a_bounded_load_of_128_streams_loses_nothing_and_memory_stays_flat(server: Server) -> None:
    async def wave(client: openai.AsyncOpenAI, first: int, count: int) -> None:
        gate = asyncio.Semaphore(64)

        async def one(i: int) -> None:
            async with gate:
                stream = await client.chat.completions.create(
                    model="smollm2", messages=[{"role": "user", "content": f"Client {i}, say your name."}],
                    max_tokens=12, stream=True, stream_options={"include_usage": True},
                    extra_body={"grammar": grammar_for(f"client-{i} ok")})
                chunks = [c async for c in stream]
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                assert text == f"client-{i} ok", (i, text)
                assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0

        await asyncio.gather(*(one(i) for i in range(first, first + count)))

    async def main() -> tuple[int, int]:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300,
                                    http_client=None)
        try:
            await wave(client, 0, 64)
            warm = server.rss_kib()
            await wave(client, 64, 64)
            return warm, server.rss_kib()
        finally:
            await client.close()

    warm, end = asyncio.run(main())
    assert end - warm < 64 * 1024, (warm, end)  # KiB: no growth with the number of requests served


def test_a_full_queue_answers_503_with_retry_after(tmp_path: Path) -> None:
    server = Server("smollm2", "-np", "1", "--queue", "1", "-c", "2048", home=tmp_path / "home")
    try:
        body = {"messages": [{"role": "user", "content": "Write a long essay."}], "max_tokens": 300,
                "ignore_eos": True}
        results: list[httpx.Response] = []

        def post() -> None:
            results.append(httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120))

        threads = [threading.Thread(target=post) for _ in range(3)]
        for t in threads:
            t.start()
            time.sleep(0.3)  # one runs, one waits, the third finds the queue full
        for t in threads:
            t.join()
        statuses = sorted(r.status_code for r in results)
        assert statuses == [200, 200, 503], [r.text for r in results]
        full = next(r for r in results if r.status_code == 503)
        assert full.headers["Retry-After"].isdigit() and full.json()["error"]["type"] == "server_error"
    finally:
        assert server.stop() == 0


def test_an_api_key_guards_everything_but_health(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("s3cret\n")
    server = Server("smollm2", "-np", "1", "-c", "1024", "--api-key-file", str(key_file),
                    home=tmp_path / "home")
    try:
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            r = httpx.get(server.url + "/v1/models", headers=headers, timeout=10)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        good = openai.OpenAI(base_url=server.url + "/v1", api_key="s3cret", max_retries=0)
        assert good.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Hi"}],
                                            max_tokens=2).choices
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0).models.list()
    finally:
        assert server.stop() == 0


def test_sigterm_ends_running_streams_cleanly_and_exits_0(tmp_path: Path) -> None:
    server = Server("smollm2", "-np", "2", "-c", "4096", "--host", "0.0.0.0", home=tmp_path / "home")
    assert any("without an API key" in line for line in server.log), server.log
    lines: list[str] = []
    started = threading.Event()

    def listen() -> None:
        with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=120,
                          json={"messages": [{"role": "user", "content": "Write a very long story."}],
                                "max_tokens": 1500, "stream": True, "ignore_eos": True}) as r:
            for line in r.iter_lines():
                lines.append(line)
                started.set()

    reader = threading.Thread(target=listen)
    reader.start()
    assert started.wait(60)
    t0 = time.monotonic()
    assert server.stop(signal.SIGTERM) == 0, "".join(server.log)
    reader.join(30)
    assert time.monotonic() - t0 < 30  # bounded (the grace period is 5 s)
    data = [line for line in lines if line.startswith("data: ")]
    assert data[-1] == "data: [DONE]"
    assert json.loads(data[-2][6:])["choices"][0]["finish_reason"] == "length"
    assert "Traceback" not in "".join(server.log)
    assert server.log[-1] == ("infer: stopped (SIGTERM) while 1 request running, 0 waiting; 0 finished in "
                              "the 5 s grace period, 1 cut off, 0 refused\n"), server.log


def test_models_load_on_first_use_and_unload_when_idle_or_least_recently_used(tmp_path: Path) -> None:
    server = Server("smollm2", "-np", "1", "-c", "1024", "--keep-alive", "1s", home=tmp_path / "home")
    try:
        def loaded() -> list[str]:
            return httpx.get(server.url + "/health", timeout=10).json()["loaded"]

        def ask(model: str) -> None:
            r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
                "model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
            assert r.status_code == 200, r.text

        ask("smollm2")
        assert loaded() == ["smollm2"]
        # a name that cannot be served is 404 and unloads nothing (it used to make room first)
        r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
            "model": "no-such-model", "messages": [{"role": "user", "content": "Hi"}]})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
        assert loaded() == ["smollm2"]
        ask("smollm2:135m")  # another name: with --max-models 1 the idle one makes room
        assert loaded() == ["smollm2:135m"]
        end = time.monotonic() + 20
        while loaded() and time.monotonic() < end:  # idle past --keep-alive: unloaded
            time.sleep(0.2)
        assert loaded() == []
        ask("smollm2")  # and loaded again on use
        assert loaded() == ["smollm2"]
        ids = [m["id"] for m in httpx.get(server.url + "/v1/models", timeout=10).json()["data"]]
        assert "smollm2" in ids and "smollm2:135m" in ids
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize(("args", "code", "fragment"), [
    (["smollm2", "--port", "99999"], 2, "not a port number"),
    (["smollm2", "--keep-alive", "soon"], 2, "give a duration"),
    (["smollm2", "--parallel", "0"], 2, "--parallel"),
    (["smollm2", "--api-key", "a", "--api-key-file", "k"], 2, "not both"),
    (["smollm2", "-md", "smollm2"], 2, "prompt lookup only"),
    (["no-such-model"], 3, "no-such-model"),
])
def test_bad_flags_are_one_line_errors(args: list[str], code: int, fragment: str) -> None:
    assert_one_line_error(run_cli("serve", *args, "--port", "0") if "--port" not in args
                          else run_cli("serve", *args), code, fragment)


def test_a_port_in_use_is_exit_5() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert_one_line_error(run_cli("serve", "smollm2", "--port", port), 5, "Address already in use")


def test_a_restarted_server_loads_a_long_prefix_from_the_prompt_cache(tmp_path: Path, smollm2: Path) -> None:
    """The state of a long system prompt is saved on disk as the first request prefills it, and
    the next server (a restart) loads it for a new question instead of computing it again."""
    home = tmp_path / "home"
    system = "Answer from this text. " + "The quick brown fox jumps over the lazy dog. " * 40
    env = {"INFER_HOME": str(home)}

    def ask(question: str, *flags: str) -> dict:
        server = Server("smollm2", "-np", "2", "-c", "4096", *flags, home=home)
        try:
            r = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
                "max_tokens": 16, "temperature": 0, "return_tokens": True})
            assert r.status_code == 200, r.text
            return r.json()
        finally:
            assert server.stop() == 0

    def saved() -> list[dict]:
        listed = run_cli("cache", "list", "--json", env=env)
        assert listed.returncode == 0, listed.stderr
        return json.loads(listed.stdout)

    ask("Who jumps?", "--no-cache")
    assert saved() == []
    first = ask("Who jumps?")
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    entries = saved()
    assert [e["model"] for e in entries] == ["smollm2"] and entries[0]["tokens"] >= 256
    question = "Who is lazy?"
    second = ask(question)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == entries[0]["tokens"]
    assert len(saved()) == 1  # nothing new to save
    with Session.open(smollm2, ContextParams(n_ctx=2048)) as session:  # and the reply is right
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        tokens = chat_prompt(session.model, messages).tokens
        params = SamplingParams(temperature=0, max_tokens=16)
        *_, done = session.generate(tokens, params)
        assert_same_or_rounding(session, tokens, done.tokens, second["choices"][0]["tokens"], params,
                                question)


def test_health_is_503_while_the_model_loads(smollm2: Path) -> None:
    """In-process: a model whose loading is held back keeps /health at 503 ("loading")."""
    from starlette.testclient import TestClient

    from infer.runtime.llama import Model
    from infer.runtime.loading import OpenedModel as Opened
    from infer.server.app import Config, create_app
    from infer.server.models import ModelPool
    from infer.server.run import _lifespan

    found, release = threading.Event(), threading.Event()

    def find_model(name: str) -> None:  # (the name is looked up first: 503 from then on)
        assert found.wait(60)

    def open_model(name: str) -> Opened:
        assert release.wait(60)
        return Opened(Model(smollm2), ContextParams(n_ctx=512), 1, {})

    pool = ModelPool(open_model, default="smollm2", listing=lambda: [], keep_alive_s=None,
                     find_model=find_model)
    config = Config()
    with TestClient(create_app(pool, config, lifespan=_lifespan(pool, config))) as http:
        for step in (found, release):
            loading = http.get("/health")
            assert loading.status_code == 503, loading.json()
            assert loading.json() == {"status": "loading", "loading": ["smollm2"]}
            step.set()
        end = time.monotonic() + 60
        while (ready := http.get("/health")).status_code == 503 and time.monotonic() < end:
            time.sleep(0.05)
        assert ready.status_code == 200 and ready.json()["loaded"] == ["smollm2"]


# Where the server and the runtime disagreed, one rule now (runtime/request_params.py): the
# same value is taken or refused by a request and by `infer run`'s flag, in the same words.
@pytest.mark.parametrize(("field", "flag", "value", "refused"), [
    ("temperature", "--temp", 7, None),  # no cap at 2 (the server's alone)
    ("top_p", "--top-p", 0, None),  # the most likely token alone (the runtime refused it)
    ("typical_p", "--typical-p", 0, None),
    ("presence_penalty", "--presence-penalty", 3, None),  # no [-2, 2] (the server's alone)
    ("repeat_penalty", "--repeat-penalty", 0, "must be > 0, got 0"),  # (the server took 0)
    ("mirostat_tau", "--mirostat-ent", 0, "must be > 0, got 0"),
])
def test_a_sampling_range_is_one_rule_for_requests_and_flags(client: openai.OpenAI, server: Server, smollm2,
                                                             field, flag, value, refused) -> None:
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, field: value})
    cli = run_cli("run", smollm2, "-n", "2", flag, str(value), "Hi")
    if refused is None:
        assert r.status_code == 200, r.text
        assert cli.returncode == 0, cli.stderr
    else:
        assert r.status_code == 400 and f"{field} {refused}" in r.json()["error"]["message"], r.text
        assert cli.returncode == 2 and refused in cli.stderr, cli.stderr
