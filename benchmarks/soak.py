"""Soak `infer serve`: minutes of mixed traffic, then SIGTERM at a random moment.

    python benchmarks/soak.py [--model smollm2] [--seconds 180] [--clients 8] [--seed N]
                              [--shutdowns 50] [--json]

The server runs MODEL with 4 slots, `--max-models 1` and a short queue. Client threads
send, at random: chat replies (streamed and not), `n` > 1, grammar and JSON-schema
requests, streams cancelled after a random number of chunks, requests whose client goes
away before the reply (a read timeout), hostile bodies, requests for a second model (a
tiny one built here: every one unloads the other model and loads its own), and bursts
over the queue limit. Then the traffic stops and /metrics must show every slot free;
a last round of streams starts, and SIGTERM comes at a random moment in it.

It checks: no 5xx but 503 (overload), no transport error that the client did not cause,
valid JSON where a schema asked for it, /metrics running 0 and waiting 0 after the
traffic, exit code 0 within the grace period (5 s) plus one second, the stop line on
stderr, no temporary file left in INFER_HOME. It reports the server's resident memory
(after warm-up, at the end, the largest) and the requests by kind and status.

`--shutdowns N` then starts a server on a tiny model N times (two at a time, one thread
each), with three streams that end at different steps, and sends SIGTERM at a random
moment each time: every exit must be code 0 within the grace period plus one second.
Exit status: 0 when every check held, 1 otherwise (each failure is printed).
tests/test_soak.py runs a short form in CI.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import random
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import serve_helpers  # noqa: E402
from tiny_model import build_llama_gguf  # noqa: E402

GRACE_S = 5.0  # infer serve's grace period for running requests (server/app.py Config)
PARALLEL, QUEUE = 4, 4
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
HOSTILE = [  # (raw body, content type): each must get a 4xx
    (b"{not json", "application/json"),
    (b"\xff\xfe\x00garbage", "application/json"),
    (json.dumps({"messages": "hello"}).encode(), "application/json"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}).encode(),
     "application/json"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**12}).encode(),
     "application/json"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}).encode(),
     "application/json"),
    (json.dumps({"messages": [{"role": "wizard", "content": "hi"}]}).encode(), "application/json"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "n": 10**6}).encode(), "application/json"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "grammar": "root ::= ("}).encode(),
     "application/json"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}],
                 "response_format": {"type": "json_schema",
                                     "json_schema": {"schema": {"type": 7}}}}).encode(),
     "application/json"),
    (json.dumps({"model": "no-such-model-anywhere",
                 "messages": [{"role": "user", "content": "hi"}]}).encode(),
     "application/json"),
    (json.dumps([1, 2, 3]).encode(), "application/json"),
    (b"", "application/json"),
    (b"messages=hi", "application/x-www-form-urlencoded"),
]
WORDS = ["the", "sky", "river", "stone", "blue", "light", "story", "robot", "garden", "winter", "ocean",
         "number"]


class Server(serve_helpers.Server):
    """`infer serve` in a child process (tests/serve_helpers.py), with what the soak reads."""

    def gauges(self) -> dict[str, float]:
        """num_requests_running and num_requests_waiting, summed over the models."""
        out: dict[str, float] = collections.defaultdict(float)
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            m = re.match(r"infer:(num_requests_running|num_requests_waiting)\{[^}]*\} (\S+)", line)
            if m:
                out[m.group(1)] += float(m.group(2))
        return dict(out)

    def timed_stop(self, sig: int = signal.SIGTERM) -> tuple[int, float]:
        """Send `sig`; the exit code and the seconds until the process was gone."""
        t0 = time.monotonic()
        code = self.stop(sig)
        return code, time.monotonic() - t0


class Traffic:
    """Client threads sending a random mix of requests until a deadline."""

    def __init__(self, server: Server, model: str, second: str, seed: int) -> None:
        self.server, self.model, self.second = server, model, second
        self.seed = seed
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self.failures: list[str] = []
        self.lock = threading.Lock()
        self.go = threading.Event()  # cleared while the second model is asked for
        self.go.set()
        self.in_flight = 0

    def note(self, kind: str, outcome: str, failure: str | None = None) -> None:
        with self.lock:
            self.counts[(kind, outcome)] += 1
            if failure is not None and len(self.failures) < 50:
                self.failures.append(f"{kind}: {failure}")

    def status(self, kind: str, r: httpx.Response, *, backoff: bool = True) -> bool:
        """Count `r`; True when it is a success to look into. After a 503 the client waits
        as OpenAI's client does (Retry-After says seconds; it waits about a second)."""
        code = r.status_code
        if code >= 400 and code != 503:
            self.note(kind, str(code), f"HTTP {code}: {r.text[:200]}")
        else:
            self.note(kind, str(code))
        if code == 503 and backoff:
            time.sleep(random.uniform(0.5, 1.5))
        return code == 200

    def run(self, clients: int, seconds: float, churn_every_s: float = 5.0) -> None:
        deadline = time.monotonic() + seconds
        threads = [threading.Thread(target=self._client,
                                    args=(random.Random(self.seed * 1000 + i), deadline, i, clients))
                   for i in range(clients)]
        threads.append(threading.Thread(target=self._churn, args=(random.Random(self.seed), deadline,
                                                                   churn_every_s)))
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _client(self, rng: random.Random, deadline: float, index: int, clients: int) -> None:
        kinds = ["chat", "stream", "n", "grammar", "schema", "cancel", "disconnect", "hostile",
                 "completion", "burst"]
        weights = [6, 6, 2, 2, 2, 3, 3, 3, 2, 1]
        first = kinds[index::clients][::-1]  # every kind among the clients' first requests
        with httpx.Client(base_url=self.server.url, timeout=120) as client:
            while first or time.monotonic() < deadline:  # (each kind sent, however slow the machine)
                self.go.wait()
                kind = first.pop() if first else rng.choices(kinds, weights)[0]
                with self.lock:
                    self.in_flight += 1
                try:
                    getattr(self, "_" + kind)(client, rng)
                except httpx.TransportError as e:
                    self.note(kind, "transport error", f"{type(e).__name__}: {e}")
                finally:
                    with self.lock:
                        self.in_flight -= 1

    def _churn(self, rng: random.Random, deadline: float, every_s: float) -> None:
        """Now and then the clients pause, and a request for the second model unloads the
        first (--max-models 1), loads its own, and the next requests load the first again.
        (A model that serves requests is not unloaded: asked for while it is busy, the other
        gets 503 at once.)"""
        with httpx.Client(base_url=self.server.url, timeout=120) as client:
            while time.monotonic() + every_s < deadline:
                time.sleep(rng.uniform(0.5, 1.5) * every_s)
                self.go.clear()
                while self.in_flight:
                    time.sleep(0.01)
                try:
                    self._second(client, rng)
                except httpx.TransportError as e:
                    self.note("second model", "transport error", f"{type(e).__name__}: {e}")
                finally:
                    self.go.set()

    def _messages(self, rng: random.Random) -> list[dict[str, str]]:
        words = " ".join(rng.choices(WORDS, k=rng.randint(2, 40)))
        return [{"role": "user", "content": f"Tell me about {words}."}]

    def _body(self, rng: random.Random, **extra: object) -> dict[str, object]:
        return {"model": self.model, "messages": self._messages(rng), "max_tokens": rng.randint(1, 48),
                "temperature": rng.choice([0, 0.7, 1.0]), **extra}

    def _chat(self, client: httpx.Client, rng: random.Random) -> None:
        r = client.post("/v1/chat/completions", json=self._body(rng))
        if self.status("chat", r):
            assert r.json()["choices"][0]["message"]["role"] == "assistant"

    def _completion(self, client: httpx.Client, rng: random.Random) -> None:
        r = client.post("/v1/completions", json={
            "model": self.model, "prompt": " ".join(rng.choices(WORDS, k=8)),
            "max_tokens": rng.randint(1, 32), "stream": rng.random() < 0.5})
        self.status("completion", r)

    def _stream(self, client: httpx.Client, rng: random.Random) -> None:
        with client.stream("POST", "/v1/chat/completions", json=self._body(rng, stream=True)) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
            if self.status("stream", r) and lines[-1:] != ["data: [DONE]"]:
                self.note("stream", "no [DONE]", f"the stream ended with {lines[-1:]}")

    def _n(self, client: httpx.Client, rng: random.Random) -> None:
        n = rng.randint(2, 3)
        r = client.post("/v1/chat/completions", json=self._body(rng, n=n))
        if self.status("n", r) and len(r.json()["choices"]) != n:
            self.note("n", "wrong n", f"{len(r.json()['choices'])} choices for n={n}")

    def _grammar(self, client: httpx.Client, rng: random.Random) -> None:
        r = client.post("/v1/chat/completions", json=self._body(
            rng, grammar='root ::= ("yes" | "no") " because " [a-z ]{0,40}', max_tokens=64))
        if self.status("grammar", r):
            choice = r.json()["choices"][0]
            text = choice["message"]["content"]
            if choice["finish_reason"] == "stop" and not re.fullmatch(r"(yes|no) because [a-z ]{0,40}", text):
                self.note("grammar", "off grammar", repr(text))

    def _schema(self, client: httpx.Client, rng: random.Random) -> None:
        r = client.post("/v1/chat/completions", json=self._body(
            rng, max_tokens=96, temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}))
        if self.status("schema", r):
            choice = r.json()["choices"][0]
            if choice["finish_reason"] == "stop":
                try:
                    value = json.loads(choice["message"]["content"])
                    assert isinstance(value["name"], str) and isinstance(value["age"], int)
                except (ValueError, KeyError, AssertionError, TypeError):
                    self.note("schema", "invalid", repr(choice["message"]["content"][:200]))

    def _cancel(self, client: httpx.Client, rng: random.Random) -> None:
        """A stream closed by the client after a random number of chunks."""
        keep = rng.randint(0, 6)
        with client.stream("POST", "/v1/chat/completions",
                           json=self._body(rng, stream=True, max_tokens=400, ignore_eos=True)) as r:
            if not self.status("cancel", r):
                return
            for i, _ in enumerate(r.iter_lines()):
                if i >= keep:
                    break

    def _disconnect(self, client: httpx.Client, rng: random.Random) -> None:
        """A client that gives up before the reply comes (its read times out)."""
        try:
            r = client.post("/v1/chat/completions", json=self._body(rng, max_tokens=400, ignore_eos=True),
                            timeout=httpx.Timeout(120, read=rng.uniform(0.02, 0.8)))
        except httpx.ReadTimeout:
            self.note("disconnect", "gone")
            return
        self.status("disconnect", r)

    def _hostile(self, client: httpx.Client, rng: random.Random) -> None:
        body, content_type = rng.choice(HOSTILE)
        r = client.post("/v1/chat/completions", content=body, headers={"content-type": content_type})
        if r.status_code == 503 and b"no-such-model" not in body:  # checked before the queue
            self.note("hostile", "503")
            time.sleep(random.uniform(0.5, 1.5))
        elif r.status_code < 400 or r.status_code >= 500:
            self.note("hostile", str(r.status_code), f"HTTP {r.status_code} for {body[:60]!r}")
        else:
            self.note("hostile", str(r.status_code))

    def _second(self, client: httpx.Client, rng: random.Random) -> None:
        r = client.post("/v1/completions", json={"model": self.second, "prompt": "Once upon a time",
                                                 "max_tokens": rng.randint(1, 16)})
        self.status("second model", r, backoff=False)

    def _burst(self, client: httpx.Client, rng: random.Random) -> None:
        """More requests at once than the slots and the queue hold: the rest get 503."""
        results: list[httpx.Response | Exception] = []

        def one() -> None:
            try:
                results.append(client.post("/v1/chat/completions", json=self._body(rng, max_tokens=32)))
            except httpx.TransportError as e:
                results.append(e)

        threads = [threading.Thread(target=one) for _ in range(PARALLEL + QUEUE + 6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for r in results:
            if isinstance(r, Exception):
                self.note("burst", "transport error", f"{type(r).__name__}: {r}")
            else:
                self.status("burst", r, backoff=False)


def leftovers(home: Path) -> list[str]:
    """Temporary files in INFER_HOME: what an interrupted write would leave."""
    return [str(p.relative_to(home)) for p in home.rglob("*")
            if p.is_file() and (p.name.endswith((".tmp", ".partial")) or p.name.startswith(".convert-"))]


def hub_cache_with(model: Path, hf_home: Path, repo: str) -> str:
    """`model` in a Hugging Face cache of its own, as the one file of `repo` (a server loads
    models by name, from the cache, never by path); the name to request it by."""
    snapshot = hf_home / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    model.rename(snapshot / "tiny-F32.gguf")
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("0" * 40)
    return f"{repo}:F32"


def soak(args: argparse.Namespace, work: Path) -> dict[str, object]:
    rng = random.Random(args.seed)
    tiny = build_llama_gguf(work / "second.gguf", vocab="llama-spm")
    second = hub_cache_with(tiny, work / "hf", "soak/tiny-GGUF")
    home = work / "home"
    server = Server(args.model, "-np", str(PARALLEL), "-c", str(PARALLEL * 1024), "--max-models", "1",
                    "--queue", str(QUEUE), home=home,
                    env={"HF_HOME": str(work / "hf"), "HF_HUB_OFFLINE": "1"})
    failures: list[str] = []
    traffic = Traffic(server, args.model, second, args.seed)
    for warm in (args.model, args.model):  # the model loaded and its first requests served
        r = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
            "model": warm, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8})
        if r.status_code != 200:
            failures.append(f"warm-up: HTTP {r.status_code}: {r.text[:200]}")
    rss: list[tuple[float, int]] = [(0.0, server.rss_kib())]
    sampling = threading.Event()

    def sample() -> None:
        t0 = time.monotonic()
        while not sampling.wait(1.0):
            with contextlib.suppress(OSError):
                rss.append((time.monotonic() - t0, server.rss_kib()))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    traffic.run(args.clients, args.seconds)
    # every slot free once the traffic has stopped (cancelled and abandoned requests included)
    end = time.monotonic() + 30
    gauges = server.gauges()
    def busy() -> bool:
        return bool(gauges.get("num_requests_running") or gauges.get("num_requests_waiting"))

    while busy() and time.monotonic() < end:
        time.sleep(0.2)
        gauges = server.gauges()
    if gauges.get("num_requests_running") or gauges.get("num_requests_waiting"):
        failures.append(f"after the traffic /metrics still shows {gauges}")
    r = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={   # the main model back in
        "model": args.model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8})
    rss.append((rss[-1][0] + 1, server.rss_kib()))
    sampling.set()
    # the last round: streams running when SIGTERM comes, at a random moment
    last = Traffic(server, args.model, second, args.seed + 1)
    streams = [threading.Thread(target=last._stream if i % 2 else last._chat,
                                args=(httpx.Client(base_url=server.url, timeout=120), random.Random(i)))
               for i in range(PARALLEL + 2)]
    for t in streams:
        t.start()
    time.sleep(rng.uniform(0.0, 1.5))
    code, waited = server.timed_stop(signal.SIGTERM)
    for t in streams:
        t.join(30)
    stop_line = next((line.strip() for line in reversed(server.log) if "stopped (SIGTERM)" in line), None)
    if code != 0:
        failures.append(f"exit code {code} after SIGTERM:\n{''.join(server.log[-20:])}")
    if waited > GRACE_S + 1:
        failures.append(f"the server took {waited:.1f} s to exit after SIGTERM (grace {GRACE_S:g} s)")
    if stop_line is None:
        reader = "still reads" if server.reading else "is done"
        failures.append(f"no stop line on stderr (its reader {reader}); its last lines:\n"
                        + "".join(server.log[-30:]))
    if any("Traceback" in line for line in server.log):
        failures.append("a traceback on stderr:\n" + "".join(server.log[-40:]))
    left = leftovers(home)
    if left:
        failures.append(f"left half-written in INFER_HOME: {left}")
    failures += traffic.failures
    # the last round's requests may end in 503 or in a closed connection: the server is stopping
    kib = [k for _, k in rss]
    return {"seconds": args.seconds, "clients": args.clients, "requests": sum(traffic.counts.values()),
            "by_kind": {f"{k} {o}": n for (k, o), n in sorted(traffic.counts.items())},
            "overloaded_503": sum(n for (_, o), n in traffic.counts.items() if o == "503"),
            "rss_mib": {"after_warm_up": round(kib[0] / 1024, 1), "end": round(kib[-1] / 1024, 1),
                        "max": round(max(kib) / 1024, 1), "growth": round((kib[-1] - kib[0]) / 1024, 1),
                        "by_tenth": [round(kib[min(len(kib) - 1, i * len(kib) // 10)] / 1024, 1)
                                     for i in range(1, 11)]},
            "stop": {"exit_code": code, "seconds": round(waited, 2), "line": stop_line},
            "failures": failures}


def shutdowns(n: int, seed: int, work: Path, jobs: int = 2) -> dict[str, object]:
    """Start a server on a tiny model n times (`jobs` at once); SIGTERM while three streams run
    that end at different steps, at a random moment after the first token."""
    model = build_llama_gguf(work / "tiny.gguf", vocab="llama-spm")
    home = work / "home-tiny"

    def one(round_: int) -> tuple[float, str | None]:
        rng = random.Random(seed * 1000 + round_)
        server = Server(str(model), "-np", "3", "-c", "3072", "-t", "1", "--spec-type", "none", home=home)
        started = threading.Event()

        def stream(max_tokens: int) -> None:
            with contextlib.suppress(httpx.HTTPError), httpx.stream(
                    "POST", server.url + "/v1/completions", timeout=60,
                    json={"prompt": "Once upon a time", "max_tokens": max_tokens, "ignore_eos": True,
                          "stream": True}) as r:
                for _ in r.iter_lines():
                    started.set()

        threads = [threading.Thread(target=stream, args=(m,)) for m in rng.sample([2, 8, 32, 128, 400], 3)]
        for t in threads:
            t.start()
        started.wait(30)
        time.sleep(rng.uniform(0.0, 0.05))
        code, waited = server.timed_stop(signal.SIGTERM)
        for t in threads:
            t.join(30)
        if code != 0 or waited > GRACE_S + 1:
            log = "".join(server.log[-10:])
            return waited, f"shutdown {round_}: exit code {code} after {waited:.1f} s:\n{log}"
        return waited, None

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(one, range(n)))
    waits = [w for w, _ in results]
    failures = [f for _, f in results if f is not None]
    left = leftovers(home)
    if left:
        failures.append(f"left half-written in INFER_HOME: {left}")
    return {"rounds": n, "exit_s_median": round(statistics.median(waits), 3) if waits else None,
            "exit_s_max": round(max(waits), 3) if waits else None, "failures": failures}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="the served model (default: the embedded SmolLM2)")
    ap.add_argument("--seconds", type=float, default=180, help="how long the mixed traffic runs")
    ap.add_argument("--clients", type=int, default=8, help="client threads sending at once")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shutdowns", type=int, default=0,
                    help="then this many SIGTERMs of a tiny model's server")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="infer-soak-") as tmp:
        report: dict[str, object] = {"soak": soak(args, Path(tmp)) if args.seconds > 0 else None}
        if args.shutdowns:
            report["shutdowns"] = shutdowns(args.shutdowns, args.seed, Path(tmp))
    failures = [f for part in report.values() if part for f in part["failures"]]  # type: ignore[index]
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        s = report["soak"]
        if s:
            print(f"soak: {s['requests']} requests in {s['seconds']:g} s from {s['clients']} clients; "
                  f"{s['overloaded_503']} refused with 503 (overload)")
            for name, count in s["by_kind"].items():
                print(f"  {name:<28} {count}")
            m = s["rss_mib"]
            print(f"resident memory: {m['after_warm_up']} MiB after warm-up, {m['end']} MiB at the end "
                  f"(growth {m['growth']:+} MiB), {m['max']} MiB at most; by tenths of the run: "
                  f"{' '.join(str(x) for x in m['by_tenth'])}")
            stop = s["stop"]
            print(f"SIGTERM: exit {stop['exit_code']} after {stop['seconds']} s: {stop['line']}")
        if "shutdowns" in report:
            d = report["shutdowns"]
            print(f"shutdowns: {d['rounds']} SIGTERMs with streams running: exit after "
                  f"{d['exit_s_median']} s (median), {d['exit_s_max']} s at most")
        for f in failures:
            print(f"FAILED: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
