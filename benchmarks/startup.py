"""Whole-process wall time of a one-shot run: `infer run MODEL "Hello" -n 16` beside a reference.

    python benchmarks/startup.py MODEL.gguf [-r 10] [-t THREADS] [--llama-bin DIR] [--as NAME] [--server]

``--server``: the loop of shell pipelines, through a running server. `infer serve MODEL`
is started once (its start is reported, not counted), then each repetition runs
`INFER_SERVER=URL infer run MODEL PROMPT_i -n 16` beside the reference on the same
prompt, a different prompt each time (so that no reply comes from a cache of earlier
calls, beyond what a template's preamble shares). Target: >= 4x faster per call.

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

import repacking

BARE_SCRIPT = r'''
import sys
import llama_cpp.llama_cpp as C
quiet = C.llama_log_callback(lambda *a: None)
C.llama_log_set(quiet, None)
C.llama_backend_init()
mp = C.llama_model_default_params()
mp.use_extra_bufts = sys.argv[3] == "1"
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


# What a user runs: the console script beside this Python (it leaves without the
# interpreter's teardown, cli.main.console); `python -c` where it is missing.
_SCRIPT = Path(sys.executable).parent / "infer"
INFER = ([str(_SCRIPT)] if _SCRIPT.exists()
         else [sys.executable, "-c", "from infer.cli.main import console; console()"])


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
    ap.add_argument("--server", action="store_true", help="infer run through a running infer serve")
    args = ap.parse_args()
    if args.server:
        through_a_server(args)
        return
    infer = [*INFER, "run",
             args.name or args.model,
             "Hello", "-n", "16", "-t", str(args.threads)]
    completion = args.llama_bin / "llama-completion" if args.llama_bin else None
    if completion and completion.exists():
        name = "llama-completion"
        # One conversation turn (-cnv -st) through the model's own Jinja template (--jinja;
        # without it llama-completion renders a built-in ChatML that leaves out SmolLM2's
        # default system prompt: 10 tokens against infer's 31), so both prefill the same tokens.
        ref = [str(completion), "-m", args.model, "-p", "Hello", "-n", "16", "-cnv", "-st", "--jinja",
               "-t", str(args.threads), "--no-warmup", "-c", "4096", "-fa", "off",  # as infer on a CPU
               *repacking.peer_args("llama-completion")]
    else:
        name = "bare C-API script"
        script = Path(tempfile.mkdtemp()) / "bare.py"
        script.write_text(BARE_SCRIPT)
        ref = [sys.executable, str(script), args.model, str(args.threads), str(int(repacking.state().on))]
    timed(infer)  # the first run pays for cold caches; not counted
    timed(ref)
    ours, theirs = [], []
    for _ in range(args.repetitions):
        ours.append(timed(infer))
        theirs.append(timed(ref))
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"model: {args.model}   threads: {args.threads}   {args.repetitions} runs each, medians")
    print(repacking.line())
    print(f"infer run -n 16      {a:6.3f} s")
    print(f"{name:<20} {b:6.3f} s")
    print(f"ratio                {a / b:6.3f}  (target <= 1.2)")


def reference(args: argparse.Namespace, prompt: str) -> list[str]:
    completion = args.llama_bin / "llama-completion" if args.llama_bin else None
    if not completion or not completion.exists():
        sys.exit("--server compares with llama-completion: give --llama-bin DIR "
                 "(benchmarks/build_llama_tools.sh)")
    return [str(completion), "-m", args.model, "-p", prompt, "-n", "16", "-cnv", "-st", "--jinja",
            "-t", str(args.threads), "--no-warmup", "-c", "4096", "-fa", "off",
            *repacking.peer_args("llama-completion")]


def through_a_server(args: argparse.Namespace) -> None:
    import re
    import threading

    home = tempfile.mkdtemp()
    env = {**os.environ, "INFER_HOME": home}
    t0 = time.perf_counter()
    server = subprocess.Popen([*INFER, "serve",
                               args.name or args.model, "--port", "0", "-np", "1", "-t", str(args.threads),
                               "-fa", "off", "--no-socket"], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    assert server.stderr is not None
    url = None
    for raw in server.stderr:
        found = re.search(r"serving on (http://\S+:\d+)/v1", raw.decode())
        if found:
            url = found.group(1)
            break
    if url is None:
        sys.exit("infer serve did not start")
    threading.Thread(target=server.stderr.read, daemon=True).start()  # (drained, never blocks it)
    import urllib.request

    while True:  # until the model is loaded
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(0.05)
    started = time.perf_counter() - t0
    infer_env = {**env, "INFER_SERVER": url}

    def infer(prompt: str) -> float:
        t = time.perf_counter()
        subprocess.run([*INFER, "run",
                        args.name or args.model, prompt, "-n", "16"], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=infer_env)
        return time.perf_counter() - t

    try:
        infer("warm-up")
        timed(reference(args, "warm-up"))
        ours, theirs = [], []
        for i in range(args.repetitions):
            prompt = f"Question {i + 1}: name a colour and say why you like it."
            sides = [lambda p=prompt: ours.append(infer(p)),
                     lambda p=prompt: theirs.append(timed(reference(args, p)))]
            for side in (sides if i % 2 == 0 else sides[::-1]):
                side()
    finally:
        server.terminate()
        server.wait(30)
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"model: {args.model}   threads: {args.threads}   {args.repetitions} calls each, alternating, "
          "medians")
    print(repacking.line())
    print(f"infer serve start (once, not counted)   {started:6.3f} s")
    print(f"INFER_SERVER=... infer run -n 16        {a:6.3f} s per call")
    print(f"llama-completion -n 16                  {b:6.3f} s per call")
    print(f"llama-completion / infer                {b / a:6.2f}x  (target >= 4)")


if __name__ == "__main__":
    main()
