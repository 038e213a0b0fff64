"""`infer serve` with its KV cache as one pool (issue 34): a request may use the whole context
whatever --parallel is, requests that together need more cells than the pool holds all
complete (admitted as cells free up, or suspended and resumed), and one that can never fit is
refused before its stream starts.

The model is a tiny random one with an 8,192-token training context: what is tested is the
server's use of the cells, not the model, and the embedded model prefills about 200 tokens a
second on 2 CPU cores (a 6,000-token prompt would take half a minute). The embedded model's
text through a preemption is tests/test_kv_pool.py's."""

from __future__ import annotations

import threading
from pathlib import Path

import openai
import pytest
from serve_helpers import Server
from tiny_model import build_llama_gguf

CTX, PARALLEL = 8192, 4  # a share would be 2,048 cells


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, fixtures: Path) -> Server:
    model = build_llama_gguf(tmp_path_factory.mktemp("model") / "tiny-8k.gguf", n_ctx_train=CTX)
    s = Server(str(model), "-np", str(PARALLEL), "-c", str(CTX), home=tmp_path_factory.mktemp("home"))
    yield s
    assert s.stop() == 0, "".join(s.log)


@pytest.fixture
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def _model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def _complete(client: openai.OpenAI, words: int, word: str = "word", max_tokens: int = 16):
    return client.completions.create(model=_model(client), prompt=word + f" {word}" * (words - 1),
                                     max_tokens=max_tokens, temperature=0, extra_body={"ignore_eos": True})


def test_a_prompt_of_6000_tokens_runs_on_four_slots_of_8192_cells(client: openai.OpenAI) -> None:
    done = _complete(client, 6000)
    assert done.usage.prompt_tokens == 6001 and done.usage.completion_tokens == 16  # (with BOS)


def test_requests_that_together_overfill_the_pool_all_complete(client: openai.OpenAI, server: Server) -> None:
    """Four prompts of 2,500 tokens and a token limit of 64 at once: 10,256 cells in a pool of
    8,192. None fails; each gets its whole reply; the pool is empty of running work after."""
    results: dict[str, object] = {}

    def ask(word: str) -> None:
        try:
            results[word] = _complete(client, 2500, word, max_tokens=64)
        except Exception as e:  # (reported below)
            results[word] = e

    threads = [threading.Thread(target=ask, args=(w,)) for w in ("apple", "river", "stone", "cloud")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = {word: r for word, r in results.items() if isinstance(r, Exception)}
    assert not failed and all(r.usage.completion_tokens == 64 for r in results.values()), failed
    metrics = server.metrics(_model(client))
    assert metrics["infer:num_requests_running"] == 0 and metrics["infer:request_errors_total"] == 0
    assert "infer:num_preemptions_total" in metrics


def test_a_request_that_can_never_fit_is_refused_before_its_stream(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=_model(client), prompt="word" + " word" * 8191, max_tokens=8,
                                  stream=True)
    error = caught.value.body
    assert error["code"] == "context_length_exceeded" and "8192" in error["message"]
