"""`infer embed MODEL [TEXT...]`: texts to embedding vectors (issue 37).

Texts come from the arguments, else one per line from stdin (every line, empty ones too, so
that output line N is input line N), or as `{"id", "text"}` objects with --jsonl. Every text
is tokenized and checked before the model reads any, so a text that is too long fails the
command before anything is written. Output: JSONL `{"id", "embedding"}` in input order, or one
float32 matrix (`--format npy -o FILE`), each file written whole under a temporary name.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Annotated, Any

import typer

from infer.cli import options as o
from infer.cli.errors import shielded
from infer.runtime.errors import UsageError

OUTPUT = "Output"


@o.with_options(o.ENCODER_OPTIONS)
def embed(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(
        help="An embedding model: a .gguf file, an alias, or owner/repo[:QUANT].", show_default=False)],
    texts: Annotated[list[str] | None, typer.Argument(
        help="Texts to embed (none: one per line from stdin).", show_default=False)] = None,
    jsonl: Annotated[bool, typer.Option(
        "--jsonl", help='stdin lines are {"id": ..., "text": ...} objects.')] = False,
    output: Annotated[str | None, typer.Option(
        "-o", "--output", help="Write to this file instead of stdout.", rich_help_panel=OUTPUT)] = None,
    format_: Annotated[str, typer.Option(
        "--format", metavar="jsonl|npy", help="JSONL lines, or one float32 matrix (.npy, with -o).",
        rich_help_panel=OUTPUT)] = "jsonl",
    normalize: Annotated[bool, typer.Option(
        "--normalize/--no-normalize", help="Scale each vector to length 1 (for cosine similarity).")] = True,
    pooling: Annotated[str | None, typer.Option(
        "--pooling", metavar="mean|cls|last|none",
        help="How a text's token vectors become one (default: the model's); none gives each token's.",
        show_default=False)] = None,
    dimensions: Annotated[int | None, typer.Option(
        "--dimensions", help="Keep the first N dimensions, then normalize (Matryoshka models).",
        show_default=False)] = None,
    prefix: Annotated[str | None, typer.Option(
        "--prefix", help='Put before each text, as some models expect ("query: ", "search_document: "; '
        "default: the alias's document prefix, none for a file).", show_default=False)] = None,
    query: Annotated[bool, typer.Option(
        "--query", help="The texts are search queries: put the alias's query prefix before each "
        '(nomic-embed-text\'s "search_query: ") instead of its document prefix.')] = False,
    truncate: Annotated[bool, typer.Option(
        "--truncate", help="Cut a text longer than the model reads, instead of failing.")] = False,
    batch_size: Annotated[int, typer.Option(
        "-b", "--batch-size",
        help="The longest text, in tokens (several short texts are read per decode).",
        rich_help_panel=o.CONTEXT)] = 2048,
    **_: Any,  # (o.ENCODER_OPTIONS)
) -> None:
    """Embed texts: one vector each, as JSONL or a numpy matrix."""
    shielded(execute, ctx.params)


def execute(flags: Mapping[str, Any]) -> None:
    from dataclasses import replace

    from infer.cli.flags import context_params, log_to_stderr, resolve
    from infer.runtime.embedding import EmbedParams

    if flags["verbose"]:
        log_to_stderr()
    fmt = flags["format_"]
    if fmt not in ("jsonl", "npy"):
        raise UsageError(f"--format must be jsonl or npy, not {fmt!r}")
    if fmt == "npy" and not flags["output"]:
        raise UsageError("--format npy writes a file: give -o FILE")
    if flags["pooling"] == "rank":
        raise UsageError("--pooling rank scores pairs: use infer rerank")
    if fmt == "npy" and flags["pooling"] == "none":
        raise UsageError("--format npy holds one vector per text: not with --pooling none")
    if flags["query"] and flags["prefix"] is not None:
        raise UsageError("--prefix gives the prefix itself: not with --query")
    items = read_items(flags["texts"] or [], jsonl=flags["jsonl"])
    resolved = resolve(flags)
    params = EmbedParams(prefix=_prefix(flags, resolved.entry), truncate=flags["truncate"],
                         dimensions=flags["dimensions"], normalize=flags["normalize"])
    cparams = replace(context_params(flags), pooling=flags["pooling"])
    with _open(str(resolved.path), cparams, flags, resolved.pooling) as embedder:
        tokens = [embedder.tokens(text, params, name) for _, text, name in items]
        vectors = _counted(embedder.vectors(tokens, params), len(items))
        write(vectors, [key for key, _, _ in items], flags["output"], fmt)


def _prefix(flags: Mapping[str, Any], entry: Any) -> str:
    """--prefix, else the alias's query prefix (--query) or document prefix, else none."""
    if flags["prefix"] is not None:
        return str(flags["prefix"])
    if entry is None:
        return ""
    return (entry.query_prefix or "") if flags["query"] else entry.prefix


def _open(path: str, cparams: Any, flags: Mapping[str, Any], alias_pooling: str | None) -> Any:
    """The embedder (pooling as the GGUF records, else as the alias says), refusing a model that
    records no pooling (a chat model) unless --pooling says how to pool."""
    from infer.runtime.embedding import Embedder

    embedder = Embedder.open(path, cparams, n_batch=flags["batch_size"], default_pooling=alias_pooling)
    if flags["pooling"] is None and embedder.pooling in ("none", "rank"):
        embedder.close()
        if embedder.pooling == "rank":
            raise UsageError(f"{flags['model']} is a reranker: it scores query and document pairs (infer "
                             "rerank), it gives no embeddings")
        raise UsageError(f"{flags['model']} is not an embedding model (its GGUF records no pooling): give "
                         "--pooling last (or mean) to embed with it anyway")
    return embedder


def read_items(texts: Sequence[str], *, jsonl: bool) -> list[tuple[Any, str, str]]:
    """(id, text, name for messages) of each input: the arguments, else stdin's lines (--jsonl:
    objects)."""
    from infer.cli.stdin import decode_stdin

    if texts:
        if jsonl:
            raise UsageError("--jsonl reads stdin: give no TEXT arguments with it")
        return [(i, text, f"text {i + 1}") for i, text in enumerate(texts)]
    if sys.stdin.isatty():
        raise UsageError("give texts to embed as arguments, or pipe them in, one per line")
    lines = decode_stdin(sys.stdin.buffer.read()).splitlines()
    if not jsonl:
        return [(i, text, f"stdin line {i + 1}") for i, text in enumerate(lines)]
    items = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError:
            raise UsageError(f"stdin line {n}: not a JSON object") from None
        if not isinstance(item, dict) or not isinstance(item.get("text"), str):
            raise UsageError(f'stdin line {n}: give {{"id": ..., "text": "..."}} (text a string)')
        items.append((item.get("id", n - 1), item["text"], f"stdin line {n}"))
    if not items:
        raise UsageError("stdin holds no texts")
    return items


def _counted(vectors: Iterator[Any], total: int) -> Iterator[Any]:
    """The vectors, with a count on stderr where it is a terminal and the input is long."""
    if not sys.stderr.isatty() or total < 256:
        yield from vectors
        return
    for n, vector in enumerate(vectors, 1):
        if n % 64 == 0 or n == total:
            sys.stderr.write(f"\rinfer: embedded {n:,} of {total:,} texts")
            sys.stderr.flush()
        yield vector
    sys.stderr.write("\n")


def write(vectors: Iterator[Any], keys: list[Any], output: str | None, fmt: str) -> None:
    """JSONL lines (stdout as they come, a file whole), or one .npy matrix."""
    from pathlib import Path

    from infer.runtime.atomic import write_atomic

    if fmt == "npy":
        import io

        import numpy as np

        buffer = io.BytesIO()
        np.save(buffer, np.stack(list(vectors)).astype(np.float32))
        write_atomic(Path(output or ""), buffer.getvalue())
        return
    lines = (f'{{"id": {json.dumps(key)}, "embedding": {_json_floats(vector)}}}\n'.encode()
             for key, vector in zip(keys, vectors, strict=True))
    if output:
        write_atomic(Path(output), lines)
        return
    out = sys.stdout.buffer
    for line in lines:
        out.write(line)
    out.flush()


def _json_floats(vector: Any) -> str:
    """A vector (or a matrix: --pooling none) as JSON numbers, each float32 in 9 digits."""
    import numpy as np

    if vector.ndim == 2:
        return "[" + ", ".join(_json_floats(row) for row in vector) + "]"
    return "[" + ", ".join(np.char.mod("%.9g", vector)) + "]"
