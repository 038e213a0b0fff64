"""Throughput of continuous batching against one prompt at a time, in one process.

    python benchmarks/batch.py MODEL.gguf [--prompts 64] [--tokens 128] [--parallel 16] [-t THREADS]

The same prompts, each generating exactly --tokens tokens (end-of-generation is
ignored, greedy): first through the runtime one at a time (Session.generate, as a
loop of `infer run` would, minus the process starts), then through the scheduler
with --parallel sequences in one context (what `infer batch` runs), with a KV stream per
sequence (infer batch's choice) and with one shared KV pool. Reports generated
tokens per second and the ratios. Target: >= 2.5x at 16.
"""

from __future__ import annotations

import argparse
import os
import time

import repacking

from infer.runtime.llama import Context, Model
from infer.runtime.params import ContextParams
from infer.runtime.prompt import chat_prompt
from infer.runtime.request import Request
from infer.runtime.sampling import SamplingParams
from infer.runtime.scheduler import Scheduler
from infer.runtime.session import Completion, Session

TOPICS = ["rivers", "mountains", "the sea", "bread", "trains", "bees", "winter", "clocks"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--parallel", type=int, default=16)
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--llama-batched-bench", metavar="PATH",
                    help="also run llama.cpp's llama-batched-bench (benchmarks/build_llama_tools.sh) on "
                         "the same model: 1 and --parallel sequences, same prompt and token counts")
    ap.add_argument("--kv", choices=("unified", "split", "both"), default="both",
                    help="KV cache of the batched run: one pool, a stream per sequence (what "
                         "infer batch uses), or one run of each (default)")
    args = ap.parse_args()
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    texts = [f"Write a short paragraph about {TOPICS[i % len(TOPICS)]} (number {i})."
             for i in range(args.prompts)]

    repack = repacking.state().on
    with Session.open(args.model, ContextParams(n_ctx=2048, n_threads=args.threads,
                                                repack=repack)) as session:
        prompts = [chat_prompt(session.model, [{"role": "user", "content": t}]).tokens for t in texts]
        t0 = time.perf_counter()
        sequential = 0
        for tokens in prompts:
            done = next(e for e in session.generate(tokens, params) if isinstance(e, Completion))
            sequential += done.usage.completion_tokens
        t_sequential = time.perf_counter() - t0

    a = sequential / t_sequential
    print(f"model: {args.model}   threads: {args.threads}   {args.prompts} prompts x {args.tokens} tokens")
    print(repacking.line())
    print(f"one at a time                      {a:8.1f} tokens/s  "
          f"({sequential} tokens in {t_sequential:.1f} s)")
    n_ctx = (args.parallel + 1) * (max(len(p) for p in prompts) + args.tokens + 16)
    for unified in {"unified": [True], "split": [False], "both": [True, False]}[args.kv]:
        cparams = ContextParams(n_ctx=n_ctx, n_threads=args.threads, n_seq_max=args.parallel + 1,
                                kv_unified=unified)
        with Model(args.model, repack=repack) as model, Context(model, cparams) as ctx:
            scheduler = Scheduler(model, ctx, parallel=args.parallel)
            t0 = time.perf_counter()
            batched = sum(o.completion.usage.completion_tokens for o in scheduler.run(
                Request(i, tokens, params) for i, tokens in enumerate(prompts)) if o.completion)
            t_batched = time.perf_counter() - t0
            scheduler.close()
        b = batched / t_batched
        kind = "one KV pool" if unified else "KV per sequence"
        print(f"parallel {args.parallel:<3} ({kind:<15})     {b:8.1f} tokens/s  "
              f"({batched} tokens in {t_batched:.1f} s)   ratio {b / a:.2f}  (target >= 2.5)")
    if args.llama_batched_bench:
        n_prompt = round(sum(len(p) for p in prompts) / len(prompts))
        reference(args, n_prompt)


def reference(args: argparse.Namespace, n_prompt: int) -> None:
    """llama.cpp's own batched decoding on the same file: its 1-sequence and N-sequence
    throughput (prompt + generation, its S t/s column) and their ratio."""
    import re
    import subprocess

    n_ctx = (args.parallel + 1) * (n_prompt + args.tokens + 16)
    cmd = [args.llama_batched_bench, "-m", args.model, "-c", str(n_ctx),
           "-b", "2048", "-ub", "512", "-npp", str(n_prompt), "-ntg", str(args.tokens),
           "-npl", f"1,{args.parallel}", "-t", str(args.threads), "-fa", "off",
           "-no-kvu",  # a KV stream per sequence, as infer batch (its default depends on -np)
           *repacking.peer_args("llama-batched-bench")]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 10 and re.fullmatch(r"\d+", cells[2]):
            rows[int(cells[2])] = (float(cells[7]), float(cells[9]))  # S_TG, S (all tokens)
    one, many = rows[1], rows[args.parallel]
    print(f"llama-batched-bench (prompt {n_prompt}, {args.tokens} generated, KV per sequence): "
          f"1 sequence {one[1]:.1f} t/s (generation {one[0]:.1f}), {args.parallel} sequences "
          f"{many[1]:.1f} t/s (generation {many[0]:.1f}); ratio {many[1] / one[1]:.2f} "
          f"(generation only {many[0] / one[0]:.2f})")


if __name__ == "__main__":
    main()
