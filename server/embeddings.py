"""OpenAI's embeddings API (`/v1/embeddings`, and llama-server's `/embeddings`), and Ollama's
(`/api/embed`, and its older `/api/embeddings`), issue 37.

`input` is a string, a list of strings, a list of token ids or a list of such lists;
`encoding_format` "float" (the default) or "base64" (little-endian float32, as OpenAI's client
asks for and decodes); `dimensions` keeps the first N and normalizes again. Vectors are
normalized (L2), as OpenAI's are. Every input is tokenized and checked before the model reads
any: a bad one is a 400 naming it (`input[3]`). Ollama's `/api/embed` takes `input` (a string
or strings), `truncate` (on unless false: a text longer than the model reads is cut) and
`dimensions`, and answers `embeddings`, normalized; `/api/embeddings` takes one `prompt` and
answers its `embedding`, not normalized, as Ollama's does.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import numpy as np

from infer.runtime.embedding import EmbedParams
from infer.runtime.errors import UsageError
from infer.server.errors import ApiError, invalid
from infer.server.models import Served


@dataclass(frozen=True)
class Asked:
    tokens: list[list[int]]
    params: EmbedParams
    base64: bool


def engine_of(served: Served) -> Any:
    """The served model's embedding engine; a 400 for a chat model."""
    if not served.embeds:
        raise ApiError(400, f"{served.name} is a chat model: it gives no embeddings (serve an embedding "
                       "model, one whose GGUF records its pooling, beside it)", param="model",
                       code="model_not_supported")
    if served.engine.embedder.pooling == "rank":
        raise ApiError(400, f"{served.name} is a reranker: it scores query and document pairs "
                       "(/v1/rerank), it gives no embeddings", param="model", code="model_not_supported")
    return served.engine


def parse_ollama(body: dict[str, Any], engine: Any, name: str, *, legacy: bool = False) -> Asked:
    """Ollama's /api/embed (or, `legacy`, /api/embeddings) request as an OpenAI one."""
    truncate = body.get("truncate", True)
    if not isinstance(truncate, bool):
        raise invalid("truncate", "truncate must be a boolean")
    if legacy:
        if not isinstance(body.get("prompt"), str):
            raise invalid("prompt", "prompt must be a string")
        asked = parse({"input": [body["prompt"]]}, engine, name, truncate=True)
        return Asked(asked.tokens, EmbedParams(normalize=False), False)
    value = body.get("input")
    if isinstance(value, list) and not all(isinstance(v, str) for v in value):
        raise invalid("input", "input must be a string or an array of strings")
    return parse({"input": value, "dimensions": body.get("dimensions")}, engine, name, truncate=truncate)


def ollama_reply(name: str, asked: Asked, vectors: list[np.ndarray], *,
                 legacy: bool = False) -> dict[str, Any]:
    if legacy:
        return {"embedding": vectors[0].tolist()}
    return {"model": name, "embeddings": [v.tolist() for v in vectors],
            "prompt_eval_count": sum(len(t) for t in asked.tokens)}


def parse(body: dict[str, Any], engine: Any, name: str, *, truncate: bool = False) -> Asked:
    """The request's texts as tokens for `engine` (engine_of's) of the model `name`, and what is
    done to their vectors (off the event loop: tokenizing many texts takes time)."""
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise invalid("encoding_format", f"encoding_format must be float or base64, not {fmt!r}")
    dimensions = body.get("dimensions")
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int)
                                   or dimensions < 1):
        raise invalid("dimensions", f"dimensions must be a positive integer, not {dimensions!r}")
    embedder = engine.embedder
    if dimensions is not None and dimensions > embedder.n_out:
        raise invalid("dimensions", f"dimensions {dimensions} is more than {name}'s {embedder.n_out}")
    params = EmbedParams(dimensions=dimensions, truncate=truncate)
    tokens = []
    for i, item in enumerate(_inputs(body.get("input"))):
        where = f"input[{i}]"
        try:
            tokens.append(embedder.tokens(item, params, where) if isinstance(item, str)
                          else _token_ids(item, embedder, where))
        except UsageError as e:
            raise invalid(where, str(e)) from None
    return Asked(tokens, params, fmt == "base64")


def _inputs(value: Any) -> list[str | list[int]]:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        raise invalid("input", "input must be a string, a non-empty array of strings, or token ids"
                      if value is not None else "input: Field required")
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return [value]  # one text as token ids
    for i, v in enumerate(value):
        if not isinstance(v, (str, list)):
            raise invalid(f"input[{i}]", f"input[{i}] must be a string or an array of token ids")
    return value


def _token_ids(ids: list[Any], embedder: Any, where: str) -> list[int]:
    n_vocab = embedder.model.n_vocab
    if not ids:
        raise invalid(where, f"{where} is empty")
    for j, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < n_vocab:
            raise invalid(where, f"{where}[{j}]: {t!r} is not a token id of this model (0 to {n_vocab - 1})")
    if len(ids) > embedder.max_tokens:
        raise invalid(where, f"{where} is {len(ids):,} tokens, over the {embedder.max_tokens:,} one input "
                      "may have")
    return list(ids)


def reply(name: str, asked: Asked, vectors: list[np.ndarray]) -> dict[str, Any]:
    data = [{"object": "embedding", "index": i, "embedding": _encoded(v) if asked.base64 else v.tolist()}
            for i, v in enumerate(vectors)]
    used = sum(len(t) for t in asked.tokens)
    return {"object": "list", "data": data, "model": name,
            "usage": {"prompt_tokens": used, "total_tokens": used}}


def _encoded(vector: np.ndarray) -> str:
    """base64 of the vector's little-endian float32 bytes (what OpenAI's client decodes)."""
    return base64.b64encode(vector.astype("<f4").tobytes()).decode()
