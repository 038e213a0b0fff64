"""Next-token distributions over a text: for checking a converted or quantized model."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from infer.runtime.llama import Batch
from infer.runtime.session import Session


def all_logits(session: Session, tokens: Sequence[int]) -> np.ndarray:
    """The logits at every position of `tokens` (shape: tokens x vocabulary), from an empty cache."""
    session.context.memory_clear()
    session.tokens.clear()
    n_batch = session.context.n_batch
    rows = []
    batch = Batch(n_batch)
    try:
        for start in range(0, len(tokens), n_batch):
            chunk = tokens[start:start + n_batch]
            batch.set_tokens(chunk, start_pos=start, logits_all=True)
            session.context.decode(batch)
            rows += [session.context.logits(i) for i in range(len(chunk))]
    finally:
        batch.close()
        session.context.memory_clear()
    return np.stack(rows)
