"""`infer rerank` and /v1/rerank (issue 37): a tiny random BERT cross-encoder
(BertForSequenceClassification, tests/tiny_embedders.py) converted by `infer quantize` to F32
scores each query-document pair as transformers' logit does, so the documents come in the same
order; the server's /v1/rerank and /rerank give the same; a model that is not a reranker, and
bad input, are clear errors."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import assert_one_line_error, run_cli
from tiny_embedders import build_bert_reranker, build_xlm_roberta

QUERY = "What is the capital of France?"
DOCS = ["The capital of France is Paris.", "A cat sat on the mat.", "Rome is the capital of Italy.",
        "Paris, France: the museum opened in 1911.", "Numbers: 1 2 3 4 5.", "Café in Paris — déjà vu.",
        "北京 上海", "Search the documents, rank them, then ask the model."]


@pytest.fixture(scope="module")
def reranker(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("reranker")
    folder = build_bert_reranker(d / "tiny-reranker")
    out = d / "tiny-reranker-F32.gguf"
    done = run_cli("quantize", folder, "--type", "F32", "-o", out)
    assert done.returncode == 0, done.stderr
    return folder, out


def _hf_scores(folder: Path) -> np.ndarray:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        batch = tok([QUERY] * len(DOCS), DOCS, padding=True, return_tensors="pt")
        if "token_type_ids" in batch:
            batch["token_type_ids"] = torch.zeros_like(batch["token_type_ids"])  # (one token type)
        return model(**batch).logits[:, 0].numpy()


def _ranked_as_transformers(folder: Path, gguf: Path) -> list[dict]:
    """infer rerank's lines for QUERY and DOCS, each score within 5e-3 of transformers' logit
    and in its order."""
    done = run_cli("rerank", gguf, QUERY, *DOCS, "-t", "2", "-fa", "off")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    theirs = _hf_scores(folder)
    # llama.cpp's CPU GELU reads an F16 table (tests/test_convert.py): ~1e-3 from transformers'
    for r in lines:
        assert r["text"] == DOCS[r["index"]] and abs(r["score"] - float(theirs[r["index"]])) < 5e-3, r
    assert sorted(r["index"] for r in lines) == list(range(len(DOCS)))
    for a, b in itertools.pairwise(lines):  # best first, as transformers' logits order them
        assert theirs[a["index"]] >= theirs[b["index"]] - 1e-2, (a, b)
    assert len({round(r["score"], 3) for r in lines}) > 4  # (the documents do score apart)
    return lines


def test_scores_equal_transformers_logits_and_rank_the_same(reranker: tuple[Path, Path]) -> None:
    folder, gguf = reranker
    lines = _ranked_as_transformers(folder, gguf)
    top = run_cli("rerank", gguf, QUERY, "--top-n", "2", "-t", "2", "-fa", "off",
                  input="\n".join(DOCS) + "\n")
    assert [json.loads(line) for line in top.stdout.splitlines()] == lines[:2]


def test_an_xlm_roberta_cross_encoder_scores_as_transformers_does(tmp_path: Path) -> None:
    """bge-reranker-v2-m3's shape: an XLM-RoBERTa cross-encoder with a SentencePiece Unigram
    tokenizer, a pair joined <s> query </s></s> document </s> as Hugging Face joins it."""
    folder = build_xlm_roberta(tmp_path / "tiny-xlmr-reranker", pooling=None)
    gguf = tmp_path / "tiny-xlmr-reranker-F32.gguf"
    done = run_cli("quantize", folder, "--type", "F32", "-o", gguf)
    assert done.returncode == 0 and "`infer rerank " in done.stderr, done.stderr
    _ranked_as_transformers(folder, gguf)


def test_the_server_reranks_as_the_command_does(reranker: tuple[Path, Path], tmp_path: Path) -> None:
    """/v1/rerank (llama-server's and Cohere's shape, documents as strings or {"text"} objects)
    and /rerank; an embeddings request to the reranker is a 400 that says what it is."""
    from serve_helpers import Server

    _, gguf = reranker
    ran = run_cli("rerank", gguf, QUERY, *DOCS, "-fa", "off")
    here = [json.loads(line) for line in ran.stdout.splitlines()]
    s = Server(str(gguf), "-fa", "off", home=tmp_path / "home")
    try:
        for path, docs in (("/v1/rerank", DOCS), ("/rerank", [{"text": d} for d in DOCS])):
            reply = httpx.post(s.url + path, json={"model": str(gguf), "query": QUERY, "documents": docs,
                                                   "top_n": 3, "return_documents": True}, timeout=60)
            assert reply.status_code == 200, reply.text
            results = reply.json()["results"]
            assert [r["index"] for r in results] == [h["index"] for h in here[:3]]
            for r, h in zip(results, here, strict=False):
                assert abs(r["relevance_score"] - h["score"]) < 1e-5 and r["document"]["text"] == h["text"]
            assert reply.json()["usage"]["prompt_tokens"] > len(DOCS)
        bad = httpx.post(s.url + "/v1/embeddings", json={"model": str(gguf), "input": "hi"}, timeout=60)
        assert bad.status_code == 400 and "is a reranker" in bad.json()["error"]["message"]
        for body, param in (({"query": QUERY, "documents": []}, "documents"),
                            ({"query": 3, "documents": DOCS}, "query"),
                            ({"query": QUERY, "documents": ["ok", 5]}, "documents[1]"),
                            ({"query": QUERY, "documents": DOCS, "top_n": 0}, "top_n")):
            bad = httpx.post(s.url + "/v1/rerank", json={"model": str(gguf), **body}, timeout=60)
            assert bad.status_code == 400 and bad.json()["error"]["param"] == param, bad.text
    finally:
        assert s.stop() == 0, "".join(s.log)


def test_a_model_of_another_kind_is_refused_by_each_command(reranker: tuple[Path, Path],
                                                            smollm2: Path) -> None:
    _, gguf = reranker
    assert_one_line_error(run_cli("embed", gguf, "hi"), 2,
                          "is a reranker: it scores query and document pairs")
    assert_one_line_error(run_cli("rerank", smollm2, QUERY, "a doc"), 2, "is not a reranker", "a chat model")
    assert_one_line_error(run_cli("rerank", gguf, QUERY, "--top-n", "0", "doc"), 2,
                          "--top-n must be at least 1")
