"""Whole-process wall time of a one-shot run: `infer run MODEL "Hello" -n 16` beside a reference.

    python benchmarks/startup.py MODEL.gguf [-r 10] [-t THREADS] [--llama-bin DIR] [--as NAME]

``--as NAME`` gives infer the model by another name that resolves to the same file
(``--as smollm2`` for the embedded model: what a user types), so the alias's
resolution is timed too.

The reference is llama.cpp's `llama-completion` when --llama-bin (or $LLAMA_BIN)
names a folder holding it, else a bare script over the C-API bindings run as a
process. Runs alternate between the two so that both see the same machine load;
the medians and their ratio are printed. Target: infer <= 1.5x the reference.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BARE_SCRIPT = r'''
import sys
import llama_cpp.llama_cpp as C
quiet = C.llama_log_callback(lambda *a: None)
C.llama_log_set(quiet, None)
C.llama_backend_init()
mp = C.llama_model_default_params()
m = C.llama_model_load_from_file(sys.argv[1].encode(), mp)
cp = C.llama_context_default_params()
cp.n_ctx = 4096
cp.n_threads = cp.n_threads_batch = int(sys.argv[2])
ctx = C.llama_init_from_model(m, cp)
vocab = C.llama_model_get_vocab(m)
text = b"Hello"
buf = (C.llama_token * 64)()
n = C.llama_tokenize(vocab, text, len(text), buf, 64, True, True)
chain = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
C.llama_sampler_chain_add(chain, C.llama_sampler_init_greedy())
C.llama_decode(ctx, C.llama_batch_get_one(buf, n))
tok = (C.llama_token * 1)()
import ctypes
piece = ctypes.create_string_buffer(64)
out = []
for _ in range(16):
    tok[0] = C.llama_sampler_sample(chain, ctx, -1)
    k = C.llama_token_to_piece(vocab, tok[0], piece, 64, 0, False)
    out.append(piece.raw[:k])
    C.llama_decode(ctx, C.llama_batch_get_one(tok, 1))
sys.stdout.write(b"".join(out).decode("utf-8", "replace") + "\n")
'''


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("-r", "--repetitions", type=int, default=10)
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--llama-bin", type=Path, default=os.environ.get("LLAMA_BIN"))
    ap.add_argument("--as", dest="name", help="the name infer is given (default: MODEL)")
    args = ap.parse_args()
    infer = [sys.executable, "-c", "from infer.cli.main import main; main()", "run",
             args.name or args.model,
             "Hello", "-n", "16", "-t", str(args.threads)]
    completion = args.llama_bin / "llama-completion" if args.llama_bin else None
    if completion and completion.exists():
        name = "llama-completion"
        # One conversation turn (-cnv -st): the prompt goes through the chat template, as
        # infer run's does, so both prefill the same tokens.
        ref = [str(completion), "-m", args.model, "-p", "Hello", "-n", "16", "-cnv", "-st",
               "-t", str(args.threads), "--no-warmup", "-c", "4096", "-fa", "off"]  # as infer on a CPU
    else:
        name = "bare C-API script"
        script = Path(tempfile.mkdtemp()) / "bare.py"
        script.write_text(BARE_SCRIPT)
        ref = [sys.executable, str(script), args.model, str(args.threads)]
    timed(infer)  # the first run pays for cold caches; not counted
    timed(ref)
    ours, theirs = [], []
    for _ in range(args.repetitions):
        ours.append(timed(infer))
        theirs.append(timed(ref))
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"model: {args.model}   threads: {args.threads}   {args.repetitions} runs each, medians")
    print(f"infer run -n 16      {a:6.3f} s")
    print(f"{name:<20} {b:6.3f} s")
    print(f"ratio                {a / b:6.3f}  (target <= 1.5)")


if __name__ == "__main__":
    main()
