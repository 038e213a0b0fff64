"""One `infer` command under two source trees, alternated: did a change make it slower?

    python benchmarks/ab.py --base DIR [-r 15] [--server] -- run smollm2 Hello -n 16

DIR is a checkout of the same repository at another commit (`git worktree add DIR REV`);
its code is imported in place of this tree's by putting a folder on PYTHONPATH whose
`infer` links to DIR (the installed package is an editable one: the path comes first).
Each round runs the command once under each tree, in alternating order, so that both see
the same machine; the medians of the whole-process wall times and their ratio are
printed. The first round of each is a warm-up and not counted.

``--server``: each tree starts its own `infer serve MODEL` (MODEL: the argument after
`run`), and the command runs with INFER_SERVER set to that tree's server: the start-up
of a call through a running server.
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

HERE = Path(__file__).resolve().parent.parent
INFER = [sys.executable, "-c", "from infer.cli.main import console; console()"]


def tree_env(tree: Path, scratch: Path, home: Path) -> dict[str, str]:
    """The environment that imports `infer` from `tree`."""
    link = scratch / tree.name / "infer"
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        link.symlink_to(tree)
    return {**os.environ, "PYTHONPATH": str(link.parent), "INFER_HOME": str(home)}


def start_server(env: dict[str, str], model: str) -> tuple[subprocess.Popen[bytes], str]:
    server = subprocess.Popen([*INFER, "serve", model, "--port", "0", "--no-socket"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert server.stderr is not None
    for line in server.stderr:
        text = line.decode(errors="replace")
        if "serving on " in text:
            url = text.split("serving on ", 1)[1].split()[0].removesuffix("/v1")
            return server, url
    raise SystemExit("infer serve did not start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, type=Path, help="the other checkout")
    ap.add_argument("-r", "--rounds", type=int, default=15)
    ap.add_argument("--server", action="store_true", help="through a running infer serve, one per tree")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then infer's arguments")
    args = ap.parse_args()
    command = [a for a in args.command if a != "--"] if args.command[:1] == ["--"] else args.command
    trees = {"base": args.base.resolve(), "this": HERE}
    with tempfile.TemporaryDirectory() as scratch:
        envs = {name: tree_env(tree, Path(scratch), Path(scratch) / f"home-{name}")
                for name, tree in trees.items()}
        servers = []
        if args.server:
            for env in envs.values():
                server, url = start_server(env, command[1])
                servers.append(server)
                env["INFER_SERVER"] = url
        times: dict[str, list[float]] = {name: [] for name in trees}
        try:
            for round_ in range(args.rounds + 1):
                order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
                for name in order:
                    t0 = time.perf_counter()
                    subprocess.run([*INFER, *command], env=envs[name], check=True, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
                    if round_:
                        times[name].append(time.perf_counter() - t0)
        finally:
            for server in servers:
                server.terminate()
                server.wait()
    base, this = (statistics.median(times[n]) for n in ("base", "this"))
    print(f"infer {' '.join(command)}{'  (through infer serve)' if args.server else ''}")
    print(f"base {trees['base']}: {base:.3f} s   this tree: {this:.3f} s   (medians of {args.rounds})")
    print(f"this / base: {this / base:.3f}")


if __name__ == "__main__":
    main()
