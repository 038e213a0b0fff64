"""Flash attention on or off, by depth, and where a decoding step's time goes.

    python benchmarks/flash_attn.py MODEL.gguf [-t 2] [--rounds 5] [--depths 0,512,3000]
                                    [--gen 32] [--batch 16]

For each depth (tokens already in the KV cache) and each setting (`-fa off`, `-fa on`),
measures with infer's runtime (``Session``):
- decode: --gen tokens generated one by one after the depth (greedy), tokens/s;
- a short prefill: --batch new tokens at that depth (a chat turn's message), tokens/s;
- at depth 0 also a 512-token prefill (a long one-shot prompt).
The two settings alternate within every round, in one process each round (so both see
the same machine state), and the figures are medians over the rounds.

Each decode step is split into llama_decode, the native sampler and the rest of the
Python loop (piece lookup, end-of-generation check): the per-token profile.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time

SETTINGS = ("off", "on")


def measure(model: str, fa: str, threads: int, depths: list[int], n_gen: int, n_batch: int) -> dict:
    from infer.runtime.params import ContextParams
    from infer.runtime.sampling import SamplingParams, build_sampler_chain
    from infer.runtime.session import Session

    n_ctx = max(depths) + max(n_gen, n_batch, 512) + 16
    out: dict = {}
    with Session.open(model, ContextParams(n_ctx=n_ctx, n_threads=threads, flash_attn=fa)) as s:
        assert s.context.flash_attn == fa
        rng = random.Random(0)
        tokens = [rng.randrange(1000, s.model.n_vocab - 1000) for _ in range(max(depths) + 512)]
        params = SamplingParams(temperature=0.0, ignore_eos=True)

        def at_depth(depth: int) -> None:
            s.context.memory_clear()
            s.tokens.clear()
            if depth:
                s.prefill(tokens[:depth])

        at_depth(0)
        s.prefill(tokens[:16])  # warm-up
        at_depth(0)
        t0 = time.perf_counter()
        s.prefill(tokens[:512])
        out["pp512"] = 512 / (time.perf_counter() - t0)
        for depth in depths:
            at_depth(depth)
            t0 = time.perf_counter()
            s.prefill(tokens[: depth + n_batch])
            out[f"pp{n_batch}@{depth}"] = n_batch / (time.perf_counter() - t0)
            at_depth(depth + 1)
            decode = sample = rest = 0.0
            with build_sampler_chain(params, s.model) as chain:
                for _ in range(n_gen):
                    a = time.perf_counter()
                    token = chain.sample(s.context)
                    b = time.perf_counter()
                    s.model.is_eog(token)
                    s.model.token_bytes(token)
                    c = time.perf_counter()
                    s.decode_token(token)
                    d = time.perf_counter()
                    sample, rest, decode = sample + b - a, rest + c - b, decode + d - c
            total = decode + sample + rest
            out[f"tg{n_gen}@{depth}"] = n_gen / total
            out[f"ms/token@{depth}"] = {"llama_decode": decode / n_gen * 1e3,
                                        "sampler": sample / n_gen * 1e3, "python": rest / n_gen * 1e3}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--depths", default="0,512,3000")
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--child", choices=SETTINGS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    if args.child:
        print(json.dumps(measure(args.model, args.child, args.threads, depths, args.gen, args.batch)))
        return
    runs: dict[str, list[dict]] = {fa: [] for fa in SETTINGS}
    for r in range(args.rounds):
        for fa in SETTINGS if r % 2 == 0 else SETTINGS[::-1]:
            out = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--child", fa],
                                 capture_output=True, text=True, check=True)
            runs[fa].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"model: {args.model}   threads: {args.threads}   medians of {args.rounds} rounds")
    print(f"{'test':<16} {'fa off t/s':>11} {'fa on t/s':>11} {'on / off':>9}")
    for key in runs["off"][0]:
        if key.startswith("ms/"):
            continue
        off = statistics.median(r[key] for r in runs["off"])
        on = statistics.median(r[key] for r in runs["on"])
        print(f"{key:<16} {off:>11.1f} {on:>11.1f} {on / off:>9.3f}")
    print("per decoded token (ms, medians): llama_decode / sampler / python")
    for key in (k for k in runs["off"][0] if k.startswith("ms/")):
        cells = []
        for fa in SETTINGS:
            parts = [statistics.median(r[key][p] for r in runs[fa])
                     for p in ("llama_decode", "sampler", "python")]
            cells.append(f"fa {fa}: " + " / ".join(f"{x:.3f}" for x in parts))
        print(f"{key:<16} {'   '.join(cells)}")


if __name__ == "__main__":
    main()
