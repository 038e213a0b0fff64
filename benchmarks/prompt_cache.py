"""Time to first token of `infer run` with a 2,000-token shared prefix: cold vs from the prompt cache.

    python benchmarks/prompt_cache.py MODEL.gguf [-r 3] [-t THREADS] [--command run|chat]

Each repetition starts from an empty cache (its own INFER_HOME), runs one question
after a ~2,000-token system prompt (cold: the whole prompt is prefilled, and the
prefix is saved), then another question after the same system prompt (warm: the
prefix comes from the cache). Both are separate `infer run --json` processes, as
in a shell loop. Reported: `timings.ttft_ms` (from the request, including loading
the cached state, to the first token) and each process's whole wall time; medians.
Target: warm time to first token <= 0.15x cold.

With --command chat the two processes are `infer chat` sessions of one question each
(piped, read back through /stats): the chat's first turn goes through the same cache.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

SENTENCE = "Refunds are issued within thirty days of purchase when the original receipt is shown. "


def infer_run(model: str, home: str, system: str, question: str, threads: int) -> tuple[dict, float]:
    cmd = [sys.executable, "-c", "from infer.cli.main import main; main()", "run", model, "--json",
           "-n", "1", "--temp", "0", "-t", str(threads), "-s", system, question]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "INFER_HOME": home},
                         check=True)
    return json.loads(out.stdout), (time.perf_counter() - t0) * 1000


def infer_chat(model: str, home: str, system: str, question: str, threads: int) -> tuple[dict, float]:
    """One chat turn; its /stats line in the shape of `infer run --json`'s usage and timings."""
    cmd = [sys.executable, "-c", "from infer.cli.main import main; main()", "chat", model,
           "-n", "1", "--temp", "0", "-t", str(threads), "-s", system]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, input=f"{question}\n/stats\n", capture_output=True, text=True,
                         env={**os.environ, "INFER_HOME": home}, check=True)
    wall = (time.perf_counter() - t0) * 1000
    m = re.search(r"last turn: (\d+) prompt tokens \((\d+) cached.*time to first token (\d+) ms", out.stdout)
    assert m, out.stdout
    return ({"usage": {"prompt_tokens": int(m[1]), "cached_tokens": int(m[2])},
             "timings": {"ttft_ms": float(m[3])}}, wall)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--prefix-tokens", type=int, default=2000)
    ap.add_argument("--command", choices=("run", "chat"), default="run")
    args = ap.parse_args()
    ask = infer_run if args.command == "run" else infer_chat
    system = SENTENCE * (args.prefix_tokens // 16)  # about 16 tokens a sentence
    rows: dict[str, list[float]] = {"cold_ttft": [], "warm_ttft": [], "cold_wall": [], "warm_wall": []}
    for _ in range(args.repetitions):
        with tempfile.TemporaryDirectory() as home:
            cold, cold_wall = ask(args.model, home, system, "Can I return shoes?", args.threads)
            warm, warm_wall = ask(args.model, home, system, "What about a gift?", args.threads)
        assert cold["usage"]["cached_tokens"] == 0 and warm["usage"]["cached_tokens"] > 0, (cold, warm)
        rows["cold_ttft"].append(cold["timings"]["ttft_ms"])
        rows["warm_ttft"].append(warm["timings"]["ttft_ms"])
        rows["cold_wall"].append(cold_wall)
        rows["warm_wall"].append(warm_wall)
    m = {k: statistics.median(v) for k, v in rows.items()}
    print(f"infer {args.command}   model: {args.model}   threads: {args.threads}   "
          f"repetitions: {args.repetitions}")
    print(f"prompt: {cold['usage']['prompt_tokens']} tokens cold; warm: {warm['usage']['prompt_tokens']} "
          f"tokens, {warm['usage']['cached_tokens']} from the cache")
    print(f"time to first token   cold {m['cold_ttft']:9.1f} ms   warm {m['warm_ttft']:8.1f} ms   "
          f"ratio {m['warm_ttft'] / m['cold_ttft']:.3f}  (target <= 0.15)")
    print(f"whole process         cold {m['cold_wall']:9.1f} ms   warm {m['warm_wall']:8.1f} ms   "
          f"ratio {m['warm_wall'] / m['cold_wall']:.3f}")


if __name__ == "__main__":
    main()
