"""Reranking (`/v1/rerank`, `/rerank`), issue 37: llama-server's, Jina's and Cohere's shape.

`query` and `documents` (strings, or objects with a "text", as Cohere's and Jina's clients
send), `top_n`, `return_documents`; results best first, each with its `index` in the request's
documents and its `relevance_score` (the model's logit, as llama-server's), and the document
(`{"text": ...}`) where asked. A model that is not a reranker is a 400 that says what it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infer.runtime.embedding import EmbedParams, best_first
from infer.runtime.errors import UsageError
from infer.server.errors import ApiError, invalid
from infer.server.models import Served


@dataclass(frozen=True)
class Asked:
    documents: list[str]
    pairs: list[list[int]]
    top_n: int
    return_documents: bool


def parse(body: dict[str, Any], served: Served) -> Asked:
    """The request's query and documents as the reranker's pairs of tokens (off the event loop)."""
    embedder = getattr(served.engine, "embedder", None)
    if embedder is None or embedder.pooling != "rank":
        what = "an embedding model: it answers /v1/embeddings" if embedder is not None else "a chat model"
        raise ApiError(400, f"{served.name} is not a reranker (its GGUF records no rank pooling): it is "
                       f"{what}", param="model", code="model_not_supported")
    query = body.get("query")
    if not isinstance(query, str):
        raise invalid("query", "query must be a string" if query is not None else "query: Field required")
    documents = []
    given = body.get("documents", body.get("texts"))
    if not isinstance(given, list) or not given:
        raise invalid("documents", "documents must be a non-empty array of strings")
    for i, doc in enumerate(given):
        text = doc.get("text") if isinstance(doc, dict) else doc
        if not isinstance(text, str):
            raise invalid(f"documents[{i}]", f"documents[{i}] must be a string (or an object with a text)")
        documents.append(text)
    top_n = body.get("top_n", len(documents))
    if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1:
        raise invalid("top_n", f"top_n must be a positive integer, not {top_n!r}")
    returned = body.get("return_documents", False)
    if not isinstance(returned, bool):
        raise invalid("return_documents", "return_documents must be a boolean")
    params, pairs = EmbedParams(normalize=False), []
    for i, doc in enumerate(documents):
        try:
            pairs.append(embedder.pair_tokens(query, doc, params, f"documents[{i}] with the query"))
        except UsageError as e:
            raise invalid(f"documents[{i}]", str(e)) from None
    return Asked(documents, pairs, top_n, returned)


def reply(name: str, asked: Asked, scores: list[float]) -> dict[str, Any]:
    ranked = best_first(scores, asked.top_n)
    results = [{"index": i, "relevance_score": scores[i],
                **({"document": {"text": asked.documents[i]}} if asked.return_documents else {})}
               for i in ranked]
    used = sum(len(p) for p in asked.pairs)
    return {"object": "list", "model": name, "results": results,
            "usage": {"prompt_tokens": used, "total_tokens": used}}
