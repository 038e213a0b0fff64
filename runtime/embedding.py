"""Texts to embedding vectors (issue 37): an embedding context of llama.cpp, several texts per
llama_decode.

Each text is one sequence of its own (its own sequence id, positions from 0); a batch is filled
with whole texts up to the pack's texts and tokens (FLASH_PACK, PLAIN_PACK below), and llama.cpp
pools each sequence's outputs as the context's pooling says (the model's `pooling_type`, or the
caller's: mean, cls, last; "none" gives each token's). An encoder (BERT) attends both ways, so a
text must fit one micro-batch: the context's micro-batch is its batch. A decoder's KV cache is
cleared between batches.

Vectors are then cut to `dimensions` (Matryoshka models) and L2-normalized, as llama.cpp's
`--embd-normalize 2` and sentence-transformers' Normalize do.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from infer.runtime.errors import UsageError
from infer.runtime.llama.bindings import C
from infer.runtime.llama.context import Batch, Context
from infer.runtime.llama.model import Model
from infer.runtime.params import POOLING_TYPES, ContextParams, recorded_pooling

# Texts packed into one llama_decode: (at most this many texts, this many tokens; a longer text
# goes alone). Every token of a batch attends to the whole batch, masked to its own text. With
# flash attention (an embedding context's "auto") a larger pack is as fast or faster; without
# it, attention over the masked-away tokens makes a larger pack slower. Measured on the CPU on a
# 12-layer BERT of bge-small's shape (texts per second, medians of 3 alternated rounds, F32):
# 600 texts of 10-20 tokens, flash attention on: 16 texts and 1,024 tokens 130, 8 and 512 125,
# 4 and 128 109, one per decode 73; off: 4 and 128 117, 8 and 512 89, and 64 texts (960 tokens)
# were 1.6x slower than 8. 100 texts of 60-90 tokens: 25-27 with flash attention whatever the
# pack; off, one per decode 20 against 10 with 8 and 512.
FLASH_PACK = (16, 1024)
PLAIN_PACK = (4, 128)
MAX_SEQUENCES = FLASH_PACK[0]  # the context's sequences


@dataclass(frozen=True)
class EmbedParams:
    """What is done to each text and vector: `prefix` before the text (a model's "query: "),
    over-long texts cut (`truncate`) or refused, vectors cut to `dimensions`, `normalize`d."""

    prefix: str = ""
    truncate: bool = False
    dimensions: int | None = None
    normalize: bool = True

    def __post_init__(self) -> None:
        if self.dimensions is not None and self.dimensions < 1:
            raise UsageError(f"dimensions must be at least 1, got {self.dimensions}")


def embedding_context(params: ContextParams, n_batch: int) -> ContextParams:
    """`params` made an embedding context's: a batch (and micro-batch, and KV cache) of
    `n_batch` tokens shared by up to MAX_SEQUENCES texts; flash attention on unless turned off.
    (A chat context's "auto" is off on the CPU, where it slows decoding; reading texts with it
    was twice as fast on 400-token texts, and lets more texts share a decode: FLASH_PACK.)"""
    flash = "on" if params.flash_attn == "auto" else params.flash_attn
    return replace(params, embeddings=True, n_ctx=n_batch, n_batch=n_batch, n_ubatch=n_batch,
                   n_seq_max=MAX_SEQUENCES, kv_unified=True, flash_attn=flash)


def pools(model: Model) -> str | None:
    """The pooling an embedding model's GGUF records ("mean", "cls", "last"; "rank": a
    reranker's); None where it records none or "none" (a chat model)."""
    return recorded_pooling(model.meta(f"{model.meta('general.architecture')}.pooling_type"))


class Embedder:
    """A model's embedding context: `tokens` for a text, `vectors` for many."""

    def __init__(self, model: Model, context: Context, *, owns_model: bool = True) -> None:
        """`owns_model`: close the model with the embedder."""
        self.model, self.context, self.owns_model = model, context, owns_model
        self.pooling = POOLING_TYPES[max(0, int(C.llama_pooling_type(context.ptr)))]
        self.n_out = int(C.llama_model_n_cls_out(model.ptr) if self.pooling == "rank"
                         else C.llama_model_n_embd_out(model.ptr))
        # the tokens one text may have: a batch's, and no more positions than the model has
        self.max_tokens = min(context.n_batch, model.n_ctx_train or context.n_batch)
        self.pack = FLASH_PACK if context.flash_attn == "on" else PLAIN_PACK
        self._batch = Batch(context.n_batch, MAX_SEQUENCES)

    @classmethod
    def open(cls, path: str, params: ContextParams, *, n_batch: int = 2048,
             default_pooling: str | None = None) -> Embedder:
        """The model at `path` with an embedding context of `n_batch` tokens (close it), pooling
        as params.pooling says, else as the GGUF records, else as `default_pooling` (an alias's)."""
        model = Model.load(path, params)
        try:
            if params.pooling is None and pools(model) is None and default_pooling is not None:
                params = replace(params, pooling=default_pooling)
            return cls(model, Context(model, embedding_context(params, n_batch)))
        except BaseException:
            model.close()
            raise

    def close(self) -> None:
        self._batch.close()
        self.context.close()
        if self.owns_model:
            self.model.close()

    def __enter__(self) -> Embedder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def tokens(self, text: str, params: EmbedParams, name: str) -> list[int]:
        """The text's tokens as the model reads it (its special tokens added: BERT's [CLS] and
        [SEP], a decoder's BOS or EOS); cut to max_tokens with `truncate` (the closing special
        token kept), else a UsageError naming the text (`name`)."""
        tokens = self.model.tokenize(params.prefix + text, add_special=True, parse_special=True)
        return self._fitted(tokens, params, name)

    def pair_tokens(self, query: str, document: str, params: EmbedParams, name: str) -> list[int]:
        """A query and a document as a reranker reads them: the model's rerank template (its
        {query} and {document} filled) where the GGUF has one, else joined as llama-server joins
        them, [BOS] query [EOS] [SEP] document [EOS] of the tokens the tokenizer adds (an
        XLM-RoBERTa's <s> q </s></s> d </s>); a BERT, which adds no EOS, closes the document with
        [SEP] as Hugging Face's pair encoding does. Too long: as `tokens` says."""
        model, vocab = self.model, self.model.vocab
        template = C.llama_model_chat_template(model.ptr, b"rerank")
        if template:
            text = template.decode("utf-8").replace("{query}", query).replace("{document}", document)
            tokens = model.tokenize(text, add_special=False, parse_special=True)
        else:
            eos = int(C.llama_vocab_eos(vocab))
            sep = int(C.llama_vocab_sep(vocab))
            add_eos, add_sep = bool(C.llama_vocab_get_add_eos(vocab)), bool(C.llama_vocab_get_add_sep(vocab))
            eos = eos if eos >= 0 else sep
            tokens = [model.bos] if model.add_bos else []
            tokens += model.tokenize(query, add_special=False, parse_special=False)
            tokens += [eos] * add_eos + [sep] * add_sep
            tokens += model.tokenize(document, add_special=False, parse_special=False)
            tokens += [eos] if add_eos else [sep] if add_sep else []
        return self._fitted(tokens, params, name)

    def _fitted(self, tokens: list[int], params: EmbedParams, name: str) -> list[int]:
        if not tokens:
            raise UsageError(f"{name} is empty: it gives the model no tokens to read")
        if len(tokens) <= self.max_tokens:
            return tokens
        if not params.truncate:
            raise UsageError(f"{name} is {len(tokens):,} tokens, over the {self.max_tokens:,} one text may "
                             "have (--truncate cuts it; a larger -b/--batch-size allows more, up to the "
                             "model's context)")
        closing = self._closing()
        if closing is not None and tokens[-1] == closing:
            return [*tokens[:self.max_tokens - 1], closing]
        return tokens[:self.max_tokens]

    def scores(self, pairs: Sequence[Sequence[int]]) -> list[float]:
        """A reranker's score of each pair (`pair_tokens`): its rank head's first output, as
        llama-server's (no sigmoid: the model's own logit)."""
        return [float(v[0]) for v in self.raw_vectors(pairs)]

    def _closing(self) -> int | None:
        """The token the tokenizer adds at a text's end (BERT's [SEP], an EOS), if it adds one."""
        vocab = self.model.vocab
        if C.llama_vocab_get_add_sep(vocab):
            return int(C.llama_vocab_sep(vocab))
        if C.llama_vocab_get_add_eos(vocab):
            return int(C.llama_vocab_eos(vocab))
        return None

    def vectors(self, texts: Sequence[Sequence[int]], params: EmbedParams) -> Iterator[np.ndarray]:
        """Each text's vector (its tokens' vectors, a matrix, where the pooling is "none"), in
        order, cut and normalized as `params` say."""
        self.check(params)
        for vector in self.raw_vectors(texts):
            yield shaped(vector, params)

    def check(self, params: EmbedParams) -> None:
        """A UsageError if `params` asks for more dimensions than the model gives."""
        if params.dimensions is not None and params.dimensions > self.n_out:
            raise UsageError(f"dimensions {params.dimensions} is more than the model's {self.n_out}")

    def raw_vectors(self, texts: Sequence[Sequence[int]]) -> Iterator[np.ndarray]:
        """Each text's vector as llama.cpp gives it (`vectors` before `shaped`), in order: whole
        texts batched together, as many as `pack` allows."""
        group: list[Sequence[int]] = []
        size, (most, budget) = 0, self.pack
        budget = min(budget, self.context.n_batch)
        for tokens in texts:
            if group and (size + len(tokens) > budget or len(group) == most):
                yield from self._decode(group)
                group, size = [], 0
            group.append(tokens)
            size += len(tokens)
        if group:
            yield from self._decode(group)

    def _decode(self, group: list[Sequence[int]]) -> Iterator[np.ndarray]:
        self.context.memory_clear()
        batch = self._batch
        batch.clear()
        for seq, tokens in enumerate(group):
            for pos, token in enumerate(tokens):
                batch.add(token, pos, seq, True)
        self.context.decode(batch)
        ctx = self.context.ptr
        if self.pooling != "none":
            for seq in range(len(group)):
                yield _floats(C.llama_get_embeddings_seq(ctx, seq), self.n_out)
            return
        index = 0
        for tokens in group:
            yield np.stack([_floats(C.llama_get_embeddings_ith(ctx, index + i), self.n_out)
                            for i in range(len(tokens))])
            index += len(tokens)


def best_first(scores: Sequence[float], top_n: int | None = None) -> list[int]:
    """The indices of `scores`, highest first (ties in their order), the first `top_n` of them."""
    return sorted(range(len(scores)), key=lambda i: -scores[i])[:top_n]


def _floats(ptr: ctypes.Array | None, n: int) -> np.ndarray:
    if not ptr:
        raise UsageError("llama.cpp gave no embedding for this model (is it an embedding model?)")
    return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), (n,)).copy()


def shaped(vector: np.ndarray, params: EmbedParams) -> np.ndarray:
    """`vector` (or each row of a matrix: "none" pooling) cut to params.dimensions, then
    L2-normalized if params.normalize (float32)."""
    if vector.ndim == 2:
        return np.stack([shaped(row, params) for row in vector]) if len(vector) else vector
    if params.dimensions is not None:
        vector = vector[:params.dimensions]
    if params.normalize:
        norm = float(np.sqrt(np.sum(vector.astype(np.float64) ** 2)))
        vector = vector * np.float32(1.0 / norm) if norm > 0 else vector
    return vector.astype(np.float32, copy=False)
