"""Decode and prefill speed of one model: local, over one loopback RPC worker, over two.

    python benchmarks/rpc.py MODEL.gguf [-p 64] [-n 64] [-r 3] [-t 2]

Starts `infer worker` processes on 127.0.0.1 and runs `infer bench --json` against
them in the same script run, so the three figures come from the same machine
state. With workers, `-ngl auto` puts every layer on them (split by free memory
across two); the local process keeps only the token embeddings. On loopback this
measures the protocol's cost (a round trip per graph split and the transfer of
activations), not a network's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

CLI = [sys.executable, "-c", "from infer.cli.main import main; main()"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def workers(n: int, threads: int) -> Iterator[list[str]]:
    procs, endpoints = [], []
    try:
        for _ in range(n):
            port = free_port()
            procs.append(subprocess.Popen([*CLI, "worker", "--port", str(port), "-t", str(threads)],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            endpoints.append(f"127.0.0.1:{port}")
            deadline = time.monotonic() + 60
            while True:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"worker on port {port} did not start")
                time.sleep(0.1)
        yield endpoints
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def bench(model: str, args: argparse.Namespace, rpc: list[str]) -> dict[str, float]:
    cmd = [*CLI, "bench", model, "-p", str(args.p), "-n", str(args.n), "-r", str(args.r),
           "-t", str(args.t), "--json"]
    if rpc:
        cmd += ["--rpc", ",".join(rpc)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {out.stderr.strip()}")
    rows = json.loads(out.stdout)["results"]
    return {row["test"]: row["mean_tps"] for row in rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("-p", type=int, default=64, help="prompt tokens to prefill")
    parser.add_argument("-n", type=int, default=64, help="tokens to generate")
    parser.add_argument("-r", type=int, default=3, help="repetitions")
    parser.add_argument("-t", type=int, default=2, help="threads, here and in each worker")
    args = parser.parse_args()
    results = {"local": bench(args.model, args, [])}
    for n in (1, 2):
        with workers(n, args.t) as endpoints:
            results[f"{n} worker{'s' if n > 1 else ''}"] = bench(args.model, args, endpoints)
    tests = list(results["local"])
    print(f"| | {' | '.join(tests)} | {' | '.join(f'{t} / local' for t in tests)} |")
    print("|---" * (1 + 2 * len(tests)) + "|")
    for name, row in results.items():
        speeds = " | ".join(f"{row[t]:.1f} t/s" for t in tests)
        ratios = " | ".join(f"{row[t] / results['local'][t]:.2f}" for t in tests)
        print(f"| {name} | {speeds} | {ratios} |")


if __name__ == "__main__":
    main()
