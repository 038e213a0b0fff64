"""`infer rerank MODEL QUERY [DOC...]`: documents scored against a query by a reranker (a
cross-encoder: its GGUF records rank pooling), issue 37.

Documents come from the arguments, else one per line from stdin (blank lines skipped). Output:
JSONL `{"index", "score", "text"}`, best first (`--top-n` keeps that many); the index is the
document's place among them, from 0. Scores are the model's own logits, as llama-server's.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Annotated, Any

import typer

from infer.cli import options as o
from infer.cli.errors import shielded
from infer.runtime.errors import UsageError


@o.with_options(o.ENCODER_OPTIONS)
def rerank(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(
        help="A reranker: a .gguf file, an alias, or owner/repo[:QUANT].", show_default=False)],
    query: Annotated[str, typer.Argument(help="What the documents are ranked for.", show_default=False)],
    documents: Annotated[list[str] | None, typer.Argument(
        help="The documents (none: one per line from stdin).", show_default=False)] = None,
    top_n: Annotated[int | None, typer.Option(
        "--top-n", help="Write only the N best.", show_default=False)] = None,
    truncate: Annotated[bool, typer.Option(
        "--truncate", help="Cut a pair longer than the model reads, instead of failing.")] = False,
    batch_size: Annotated[int, typer.Option(
        "-b", "--batch-size", help="The longest query and document pair, in tokens.",
        rich_help_panel=o.CONTEXT)] = 2048,
    **_: Any,  # (o.ENCODER_OPTIONS)
) -> None:
    """Rank documents by how well they answer a query (a reranker model)."""
    shielded(execute, ctx.params)


def execute(flags: Mapping[str, Any]) -> None:
    from infer.cli.flags import context_params, log_to_stderr, resolve
    from infer.runtime.embedding import Embedder, EmbedParams, best_first

    if flags["verbose"]:
        log_to_stderr()
    if flags["top_n"] is not None and flags["top_n"] < 1:
        raise UsageError(f"--top-n must be at least 1, not {flags['top_n']}")
    documents = _documents(flags["documents"] or [])
    resolved = resolve(flags)
    with Embedder.open(str(resolved.path), context_params(flags), n_batch=flags["batch_size"],
                       default_pooling=resolved.pooling) as embedder:
        if embedder.pooling != "rank":
            kind = "an embedding model (infer embed)" if embedder.pooling != "none" else "a chat model"
            raise UsageError(f"{flags['model']} is not a reranker (its GGUF records no rank pooling): it is "
                             f"{kind}")
        params = EmbedParams(truncate=flags["truncate"], normalize=False)
        pairs = [embedder.pair_tokens(flags["query"], doc, params, f"document {i + 1}")
                 for i, doc in enumerate(documents)]
        scores = embedder.scores(pairs)
    out = sys.stdout
    for i in best_first(scores, flags["top_n"]):
        line = {"index": i, "score": scores[i], "text": documents[i]}
        out.write(json.dumps(line, ensure_ascii=False) + "\n")
    out.flush()


def _documents(given: list[str]) -> list[str]:
    from infer.cli.stdin import decode_stdin

    if given:
        return given
    if sys.stdin.isatty():
        raise UsageError("give documents to rank as arguments after the query, or pipe them in, one per line")
    documents = [line for line in decode_stdin(sys.stdin.buffer.read()).splitlines() if line.strip()]
    if not documents:
        raise UsageError("stdin holds no documents")
    return documents
