"""A client that hangs up in the middle of a stream frees its slot, whichever API it spoke: the
front ends' streams (Anthropic, Responses, Ollama) tell the scheduler as OpenAI's does, and the
request is counted as aborted (the server then serves the next ones at once)."""

from __future__ import annotations

import re
import threading
import time

import httpx
import pytest
from serve_helpers import Server

STORY = "Write a long story about a lighthouse keeper."
# (path, body, what a line of generated text holds)
APIS = {
    "anthropic": ("/v1/messages", {"max_tokens": 600, "messages": [{"role": "user", "content": STORY}]},
                  '"text_delta"'),
    "responses": ("/v1/responses", {"max_output_tokens": 600, "input": STORY},
                  '"response.output_text.delta"'),
    "ollama": ("/api/chat", {"messages": [{"role": "user", "content": STORY}],
                             "options": {"num_predict": 600}}, '"content":"'),
}


@pytest.fixture
def server(qwen3_server: Server) -> Server:
    return qwen3_server


def aborted(server: Server) -> int:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    m = re.search(r'infer:request_success_total\{model_name="smollm2",finished_reason="abort"\} (\d+)', text)
    return int(m.group(1)) if m else 0


@pytest.mark.parametrize("api", list(APIS))
def test_a_client_that_hangs_up_mid_stream_frees_its_slot(server: Server, api: str) -> None:
    path, body, marker = APIS[api]
    before = aborted(server)
    texts = []

    def leave() -> None:
        payload = {"model": "smollm2", "stream": True, "temperature": 0,
                   "chat_template_kwargs": {"enable_thinking": False}, **body}
        with httpx.stream("POST", server.url + path, json=payload, timeout=60) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if marker in line and '"content":""' not in line:
                    texts.append(line)
                    return  # the first generated text: hang up

    threads = [threading.Thread(target=leave) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(texts) == 4, "a stream ended before it said anything"
    end = time.monotonic() + 30
    while time.monotonic() < end:
        m = server.metrics()
        if m["infer:num_requests_running"] == 0 and m["infer:num_requests_waiting"] == 0 \
                and aborted(server) >= before + 4:
            break
        time.sleep(0.05)
    assert m["infer:num_requests_running"] == 0 and m["infer:num_requests_waiting"] == 0, m
    assert aborted(server) == before + 4
