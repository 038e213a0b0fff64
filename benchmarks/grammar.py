"""Constrained decoding (--grammar, --json-schema): decode speed beside llama-completion.

    python benchmarks/grammar.py MODEL.gguf --llama-bin DIR [-t 2] [-n 128] [--rounds 5]

For each case (a GBNF grammar, a JSON schema), in alternating order each round:
`infer run` with the constraint, `llama-completion` with the same constraint on the
same file and rendered prompt, and `infer run` without it (what the constraint costs).
All greedy, without speculation (llama-completion has none), flash attention off on
both sides. Decode tokens/s, medians over the rounds; the ratio is infer's constrained
speed over llama-completion's. The texts are compared too: greedy decoding under the
same grammar should write the same reply (the two tools convert a JSON schema to a
grammar each with its own converter, which may differ).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import repacking

INFER = [str(Path(sys.executable).parent / "infer")]  # the console script beside this Python

SCHEMA = json.dumps({
    "type": "object",
    "properties": {"people": {"type": "array", "items": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                       "city": {"type": "string"}, "hobbies": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "age", "city", "hobbies"]}}},
    "required": ["people"]})
CASES = {
    "gbnf": ("Write a long story about a cat.", ["--grammar", "root ::= [a-zA-Z ,.]+"]),
    "json-schema": ("Describe five people as JSON: name, age, city and hobbies.", ["--json-schema", SCHEMA]),
}


def render(model: str, prompt: str) -> str:
    out = subprocess.run([*INFER, "run", model, prompt, "--show-prompt", "--no-cache"],
                         capture_output=True, text=True, check=True)
    return out.stdout  # ends with the assistant's header, printed as is


def run_infer(model: str, prompt: str, constraint: list[str], n: int, threads: int) -> tuple[float, str]:
    cmd = [*INFER, "run", model, prompt, "--json", "--temp", "0", "-n", str(n), "-t", str(threads),
           "-fa", "off", "--no-cache", "--spec-type", "none", *constraint]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"infer failed: {out.stderr[-2000:]}")
    r = json.loads(out.stdout)
    return r["timings"]["decode_tokens_per_second"], r["text"]


def run_completion(binary: Path, model: str, rendered: str, constraint: list[str], n: int,
                   threads: int) -> tuple[float, str]:
    cmd = [str(binary), "-m", model, "-p", rendered, "-n", str(n), "-t", str(threads), "--temp", "0",
           "-fa", "off", "-no-cnv", "--no-warmup", "-c", "4096", *constraint,
           *repacking.peer_args("llama-completion")]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"llama-completion failed: {out.stderr[-2000:]}")
    m = re.search(r"\beval time =\s+([\d.]+) ms /\s+(\d+) runs", out.stderr)
    if not m:
        raise SystemExit(f"llama-completion printed no timing: {out.stderr[-2000:]}")
    # It prints the prompt (special tokens as text) before the reply: keep what follows it.
    text = out.stdout.split("assistant\n", 1)[-1]
    return int(m.group(2)) / (float(m.group(1)) / 1000), text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--llama-bin", default=os.environ.get("LLAMA_BIN"),
                    help="folder with llama-completion (benchmarks/build_llama_tools.sh)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if not args.llama_bin:
        sys.exit("give --llama-bin DIR (or LLAMA_BIN)")
    completion = Path(args.llama_bin) / "llama-completion"
    print(f"model: {args.model}   threads: {args.threads}   -n {args.n}   {args.rounds} rounds, medians")
    print(repacking.line())
    for name, (prompt, constraint) in CASES.items():
        rendered = render(args.model, prompt)
        speeds: dict[str, list[float]] = {"infer": [], "llama-completion": [], "infer, no constraint": []}
        texts: dict[str, str] = {}
        for r in range(args.rounds):
            sides = list(speeds)
            for side in sides if r % 2 == 0 else sides[::-1]:
                if side == "infer":
                    tps, texts[side] = run_infer(args.model, prompt, constraint, args.n, args.threads)
                elif side == "llama-completion":
                    tps, texts[side] = run_completion(completion, args.model, rendered, constraint, args.n,
                                                      args.threads)
                else:
                    tps, _ = run_infer(args.model, prompt, [], args.n, args.threads)
                speeds[side].append(tps)
        med = {side: statistics.median(v) for side, v in speeds.items()}
        print(f"\n## {name}")
        for side, v in med.items():
            print(f"{side:22s} {v:7.1f} tokens/s")
        same = texts["infer"].strip() == texts["llama-completion"].strip()
        print(f"infer / llama-completion, constrained: {med['infer'] / med['llama-completion']:.3f}"
              f"   (the same text: {'yes' if same else 'no'})")
        print(f"constrained / unconstrained, infer:    {med['infer'] / med['infer, no constraint']:.3f}")


if __name__ == "__main__":
    main()
