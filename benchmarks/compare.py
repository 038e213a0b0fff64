"""Prefill and decode speed of infer's runtime beside its references, in one run.

    python benchmarks/compare.py MODEL.gguf [-p 512] [-n 128] [-r 5] [-t THREADS]
                                 [-fa off|on|default] [--llama-bin DIR]

Runs, on the same file and thread count:
- infer's runtime (``infer.runtime.bench``: Session.prefill and Session.generate);
- llama-cpp-python's high-level ``Llama`` class;
- a bare loop over the C API with the native sampler chain: the reference, what
  the bindings can do at best;
- llama.cpp's own ``llama-bench``, when ``--llama-bin`` (or $LLAMA_BIN) names a
  folder holding it (``benchmarks/build_llama_tools.sh`` builds it).
Each engine runs in its own child process, one after another, so they never
compete for the cores. Prints tokens/s (median ± stdev) and each ratio of medians
to the bare loop.

Flash attention changes both the speed and the rounding, and the engines' defaults
differ (llama.cpp's C API and llama-bench: auto, which is on for the CPU; infer's
auto and llama-cpp-python's ``Llama``: off on the CPU), so ``-fa`` gives every engine
the same setting: off (the default), on, or ``default`` (each engine its own).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import repacking

ENGINES = ("bare", "infer", "llama-cpp-python")
_quiet_log = None


def _stats(xs: list[float]) -> tuple[float, float]:
    """Median (what the ratios compare: one slow run on a shared machine moves it
    least) and standard deviation."""
    return statistics.median(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def run_infer(model: str, n_prompt: int, n_gen: int, reps: int, threads: int, fa: str) -> dict:
    from infer.runtime.bench import bench_decode, bench_prefill
    from infer.runtime.params import ContextParams
    from infer.runtime.session import Session

    cparams = ContextParams(n_ctx=2048, n_threads=threads, repack=repacking.state().on,
                            flash_attn="auto" if fa == "default" else fa)
    with Session.open(model, cparams) as s:
        pp = bench_prefill(s, n_prompt, reps)
        tg = bench_decode(s, n_gen, reps)
    return {"pp": list(pp.tokens_per_second), "tg": list(tg.tokens_per_second)}


def run_bare(model: str, n_prompt: int, n_gen: int, reps: int, threads: int, fa: str) -> dict:
    """The reference: the fewest binding calls that prefill and decode with native sampling."""
    import llama_cpp.llama_cpp as C  # the plain bindings, as any user of them would import

    global _quiet_log  # the callback must outlive every llama.cpp call
    _quiet_log = C.llama_log_callback(lambda *a: None)
    C.llama_log_set(_quiet_log, None)
    C.llama_backend_init()
    mp = C.llama_model_default_params()
    mp.n_gpu_layers = 0
    mp.use_extra_bufts = repacking.state().on
    m = C.llama_model_load_from_file(model.encode(), mp)
    cp = C.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_threads, cp.n_threads_batch = 2048, 2048, threads, threads
    if fa != "default":
        cp.flash_attn_type = (C.LLAMA_FLASH_ATTN_TYPE_ENABLED if fa == "on"
                              else C.LLAMA_FLASH_ATTN_TYPE_DISABLED)
    ctx = C.llama_init_from_model(m, cp)
    mem = C.llama_get_memory(ctx)
    vocab = C.llama_model_get_vocab(m)
    n_vocab = C.llama_vocab_n_tokens(vocab)
    import random

    rng = random.Random(0)
    prompt = [rng.randrange(1000, n_vocab - 1000) for _ in range(n_prompt)]
    arr = (C.llama_token * n_prompt)(*prompt)
    pp, tg = [], []
    C.llama_decode(ctx, C.llama_batch_get_one(arr, 16))  # warm-up
    for _ in range(reps):
        C.llama_memory_clear(mem, True)
        t0 = time.perf_counter()
        C.llama_decode(ctx, C.llama_batch_get_one(arr, n_prompt))
        pp.append(n_prompt / (time.perf_counter() - t0))
    sp = C.llama_sampler_chain_default_params()
    chain = C.llama_sampler_chain_init(sp)
    C.llama_sampler_chain_add(chain, C.llama_sampler_init_greedy())
    tok = (C.llama_token * 1)()
    for rep in range(reps + 1):
        C.llama_memory_clear(mem, True)
        tok[0] = prompt[0]
        C.llama_decode(ctx, C.llama_batch_get_one(tok, 1))
        t0 = time.perf_counter()
        for i in range(n_gen):
            tok[0] = C.llama_sampler_sample(chain, ctx, -1)
            if i < n_gen - 1:
                C.llama_decode(ctx, C.llama_batch_get_one(tok, 1))
        if rep:
            tg.append(n_gen / (time.perf_counter() - t0))
    return {"pp": pp, "tg": tg}


def run_llama_cpp_python(model: str, n_prompt: int, n_gen: int, reps: int, threads: int,
                         fa: str) -> dict:
    from llama_cpp import Llama

    repacking.patch_llama_cpp_python()
    llm = Llama(model, n_ctx=2048, n_batch=2048, n_threads=threads, n_gpu_layers=0,
                flash_attn=fa == "on", verbose=False)
    import random

    rng = random.Random(0)
    prompt = [rng.randrange(1000, llm.n_vocab() - 1000) for _ in range(n_prompt)]
    llm.eval(prompt[:16])
    pp, tg = [], []
    for _ in range(reps):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        pp.append(n_prompt / (time.perf_counter() - t0))
    for rep in range(reps + 1):
        llm.reset()
        llm.eval(prompt[:1])
        t0 = time.perf_counter()
        for n, _tok in enumerate(llm.generate([], temp=0.0, reset=False), start=1):
            if n == n_gen:
                break
        if rep:
            tg.append(n_gen / (time.perf_counter() - t0))
    return {"pp": pp, "tg": tg}


def run_llama_bench(binary: Path, model: str, n_prompt: int, n_gen: int, reps: int,
                    threads: int, fa: str) -> dict:
    out = subprocess.run([str(binary), "-m", model, "-p", str(n_prompt), "-n", str(n_gen),
                          "-r", str(reps), "-t", str(threads), "-o", "json",
                          "-fa", "auto" if fa == "default" else fa, *repacking.peer_args("llama-bench")],
                         capture_output=True, text=True, check=True)
    rows = json.loads(out.stdout)
    result: dict[str, list[float]] = {}
    for row in rows:
        key = "pp" if row["n_prompt"] else "tg"
        result[key] = [float(x) for x in row["samples_ts"]]
    return result


def child(engine: str, args: argparse.Namespace) -> None:
    fn = {"infer": run_infer, "bare": run_bare, "llama-cpp-python": run_llama_cpp_python}[engine]
    print(json.dumps(fn(args.model, args.n_prompt, args.n_gen, args.repetitions, args.threads,
                        args.flash_attn)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-r", "--repetitions", type=int, default=5)
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--rounds", type=int, default=2,
                    help="run every engine this many times, interleaved, to spread out noise")
    ap.add_argument("-fa", "--flash-attn", choices=("off", "on", "default"), default="off",
                    help="flash attention for every engine (default: off, infer's CPU default)")
    ap.add_argument("--llama-bin", type=Path, default=os.environ.get("LLAMA_BIN"))
    ap.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args)
        return
    results: dict[str, dict[str, list[float]]] = {}
    engines = list(ENGINES)
    bench_bin = args.llama_bin / "llama-bench" if args.llama_bin else None
    if bench_bin and bench_bin.exists():
        engines.append("llama-bench")
    for _ in range(args.rounds):
        for engine in engines:
            if engine == "llama-bench":
                r = run_llama_bench(bench_bin, args.model, args.n_prompt, args.n_gen,
                                    args.repetitions, args.threads, args.flash_attn)
            else:
                out = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--child", engine],
                                     capture_output=True, text=True, check=True)
                r = json.loads(out.stdout.strip().splitlines()[-1])
            for k, v in r.items():
                results.setdefault(engine, {}).setdefault(k, []).extend(v)
    base = {k: _stats(results["bare"][k])[0] for k in ("pp", "tg")}
    print(f"model: {args.model}   threads: {args.threads}   pp{args.n_prompt} / tg{args.n_gen}, "
          f"{args.repetitions} repetitions x {args.rounds} rounds   flash attention: {args.flash_attn}")
    print(repacking.line())
    print(f"{'engine':<18} {'prefill t/s':>16} {'ratio':>6} {'decode t/s':>16} {'ratio':>6}")
    for engine in engines:
        cells = []
        for k in ("pp", "tg"):
            median, sd = _stats(results[engine][k])
            cells.append(f"{median:>9.1f} ± {sd:<5.1f} {median / base[k]:>6.3f}")
        print(f"{engine:<18} {cells[0]} {cells[1]}")


if __name__ == "__main__":
    main()
