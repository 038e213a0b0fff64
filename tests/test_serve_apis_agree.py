"""Each API infer serves gives `infer run`'s greedy text for the same messages: OpenAI's chat
and Responses APIs, Anthropic's Messages and Ollama's chat, each through its official client,
against the `infer run` command itself (thinking off on both sides, the same template)."""

from __future__ import annotations

import json

import anthropic
import ollama
import openai
import pytest
from conftest import run_cli
from serve_helpers import Server
from tiny_model import fixtures_dir

QWEN3 = fixtures_dir() / "chat-templates" / "Qwen-Qwen3-0.6B.jinja"
N = 16
ASKS = [("Answer briefly.", "Name three rivers."), (None, "What is 2+2?")]


@pytest.fixture
def server(qwen3_server: Server) -> Server:
    return qwen3_server


def _turns(system: str | None, user: str) -> list[dict]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]


def _chat(server: Server, system: str | None, user: str) -> str:
    messages = _turns(system, user)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    return client.chat.completions.create(
        model="smollm2", messages=messages, temperature=0, max_tokens=N,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}}).choices[0].message.content


def _responses(server: Server, system: str | None, user: str) -> str:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    return client.responses.create(model="smollm2", instructions=system, input=user, temperature=0,
                                   max_output_tokens=N, reasoning={"effort": "none"}).output_text


def _messages(server: Server, system: str | None, user: str) -> str:
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
    reply = client.messages.create(model="smollm2", max_tokens=N, messages=_turns(None, user),
                                   thinking={"type": "disabled"}, extra_body={"temperature": 0},
                                   **({"system": system} if system else {}))
    return "".join(b.text for b in reply.content if b.type == "text")


def _ollama(server: Server, system: str | None, user: str) -> str:
    messages = _turns(system, user)
    client = ollama.Client(host=server.url, timeout=120)
    return client.chat(model="smollm2", messages=messages, think=False,
                       options={"temperature": 0, "num_predict": N}).message.content


@pytest.mark.parametrize("system, user", ASKS)
def test_every_api_gives_infer_runs_greedy_text(server: Server, system: str | None, user: str) -> None:
    ran = run_cli("run", "smollm2", "--chat-template-file", QWEN3, "--think", "off", "--temperature", "0",
                  "-n", N, "--json", *(["--system", system] if system else []), user)
    assert ran.returncode == 0, ran.stderr
    text = json.loads(ran.stdout)["text"]
    assert text.strip()
    served = {api.__name__[1:]: api(server, system, user) for api in (_chat, _responses, _messages, _ollama)}
    assert served == dict.fromkeys(served, text)
