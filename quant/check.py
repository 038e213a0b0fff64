"""What quantization cost: a quantized model's next-token distributions beside its source's.

The figures are the ones llama.cpp's perplexity tool reports for a quant, on a
short built-in text: mean KL divergence from the source's distributions, and how
often both pick the same most likely token. An embedding model (its GGUF records a pooling)
predicts no tokens: its sentences' vectors are compared instead (mean and least cosine).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from infer.quant.gguf_check import check_gguf

# Ordinary prose, a little code and numbers: a quick, varied probe.
CHECK_TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined movable metal type, oil-based ink and a screw press adapted from wine making. Within "
    "fifty years, presses were working in more than two hundred cities, and the price of books fell "
    "so far that reading spread beyond monasteries and courts. Scholars could compare identical "
    "copies of a text, errors stopped multiplying with every hand copy, and new ideas travelled "
    "faster than their authors.\n\n"
    "def mean(values):\n    \"\"\"Return the arithmetic mean of a non-empty list.\"\"\"\n"
    "    return sum(values) / len(values)\n\n"
    "print(mean([3, 5, 8, 13]))  # 7.25\n\n"
    "In 2023 the station recorded 1,284 mm of rain, 17% above its thirty-year average; the wettest "
    "month was November, with 212 mm over nineteen days."
)


@dataclass(frozen=True)
class QualityReport:
    size_bytes: int
    bits_per_weight: float
    mean_kl: float | None  # mean KL divergence of next-token distributions from the source's
    top1_agreement: float | None  # share of positions where both pick the same most likely token
    tokens: int
    cosine: tuple[float, float] | None = None  # an embedding model's: (mean, least) over sentences


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def compare(reference: np.ndarray, candidate: np.ndarray) -> tuple[float, float]:
    """Mean KL(reference || candidate) over positions, and top-1 agreement."""
    ref, cand = _log_softmax(reference.astype(np.float64)), _log_softmax(candidate.astype(np.float64))
    kl = (np.exp(ref) * (ref - cand)).sum(axis=-1)
    agree = (reference.argmax(-1) == candidate.argmax(-1)).mean()
    return float(kl.mean()), float(agree)


def quality(source: Path, quantized: Path, *, threads: int | None = None,
            repack: bool = True) -> QualityReport:
    """Run both models on the built-in text and compare their predictions (an embedding
    model's: its sentences' vectors)."""
    from infer.runtime.evaluate import all_logits
    from infer.runtime.params import ContextParams
    from infer.runtime.session import Session

    params = ContextParams(n_ctx=512, n_threads=threads, cache_type_k="f32", cache_type_v="f32",
                           flash_attn="off", repack=repack)
    info = check_gguf(quantized)
    n_params = sum(int(np.prod(t.shape)) for t in info.tensors)
    size = quantized.stat().st_size
    if check_gguf(source).pooling is not None:  # an embedding model: no next tokens to compare
        cosines, count = _embedding_cosines(source, quantized, params)
        return QualityReport(size, size * 8 / max(n_params, 1), None, None, count,
                             (float(cosines.mean()), float(cosines.min())))
    logits = []
    tokens: list[int] = []
    for path in (source, quantized):
        with Session.open(path, params) as session:
            if not tokens:
                tokens = session.model.tokenize(CHECK_TEXT, add_special=True, parse_special=False)[:500]
            logits.append(all_logits(session, tokens))
    mean_kl, agreement = compare(logits[0], logits[1])
    return QualityReport(size, size * 8 / max(n_params, 1), mean_kl, agreement, len(tokens))


def _embedding_cosines(source: Path, quantized: Path, params: object) -> tuple[np.ndarray, int]:
    """Each sentence of the built-in text embedded by both models: their vectors' cosines, and
    the tokens read."""
    from infer.runtime.embedding import Embedder, EmbedParams

    sentences = [s.strip() for s in CHECK_TEXT.replace("\n", " ").split(". ") if s.strip()]
    vectors, count = [], 0
    embed = EmbedParams(truncate=True)
    for path in (source, quantized):
        with Embedder.open(str(path), params, n_batch=512) as embedder:  # type: ignore[arg-type]
            tokens = [embedder.tokens(s, embed, "sentence") for s in sentences]
            count = sum(len(t) for t in tokens)
            vectors.append(np.stack(list(embedder.vectors(tokens, embed))))
    return (vectors[0] * vectors[1]).sum(axis=1), count
