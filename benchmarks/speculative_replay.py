"""Speculation policies replayed on fixed texts: cost-aware against fixed draft lengths.

    python benchmarks/speculative_replay.py MODEL.gguf [-t 2] [-n 512] [--lengths 2,3,4,6,8] [--flash-attn on]
                                            [--text FILE ...] [--replies FILE.json]

`speculative.py` measures real runs, where each side writes its own text (verification
batches round differently, and a small model's greedy reply parts early). This script
takes the texts out of the comparison: it writes each benchmark prompt's reply once
without speculation (and reads any --text FILE, e.g. llama-lookup's output, as a reply
to the edit prompt), measures the cost profile on this machine as `infer run` does,
then drives the speculator with each reply instead of the model. A step costs what a
batch of its size costs in the profile; a guess is right where it equals the reply.
The figure is the reply's tokens over the steps' summed cost (the speed-up over
decoding one token at a time), for the default policy and for fixed lengths of the
same prompt lookup; and the oracle, the bound of any length policy over this lookup
(each step verifies exactly the guesses that prove right).

`--replies FILE.json` keeps the replies and the profile: written by the first run, read
instead of the model by the next ones (to compare proposers on the same texts quickly).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from speculative import TASKS

from infer.runtime.params import ContextParams
from infer.runtime.prompt import chat_prompt
from infer.runtime.sampling import SamplingParams
from infer.runtime.session import Completion, Session
from infer.runtime.speculative import SpecParams, Speculator, follow


def replay(prompt: Sequence[int], reply: Sequence[int], params: SpecParams,
           profile: dict) -> tuple[float, int, int]:
    """(speed-up, guesses, guesses right) of `params` on `reply`."""
    spec = Speculator(params, profile=profile)
    cost, drafted, accepted = 0.0, 0, 0
    for guessed, right in follow(spec, prompt, reply):
        cost += spec.costs.cost(guessed + 1)
        drafted, accepted = drafted + guessed, accepted + right
    return len(reply) / cost, drafted, accepted


def oracle(prompt: Sequence[int], reply: Sequence[int], n_max: int, profile: dict) -> tuple[float, int, int]:
    """The bound of any length policy over this prompt lookup: each step verifies exactly the
    guesses that will prove right (up to n_max), none when the first is wrong."""
    spec = Speculator(SpecParams(n_max=n_max), profile=profile)
    lookup = spec.proposer
    lookup.sync(prompt)
    pos, cost, accepted = 0, 0.0, 0
    while pos < len(reply):
        lookup.extend([reply[pos]])
        room = min(len(reply) - pos - 1, n_max)
        proposal = lookup.propose(room) if room > 0 else None
        guesses = proposal.tokens if proposal is not None else []
        right = 0
        while right < len(guesses) and guesses[right] == reply[pos + 1 + right]:
            right += 1
        lookup.extend(guesses[:right])
        cost += spec.costs.cost(right + 1)
        accepted += right
        pos += right + 1
    return len(reply) / cost, accepted, accepted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=512, help="tokens per reply")
    ap.add_argument("--lengths", default="2,3,4,6,8")
    ap.add_argument("--flash-attn", choices=["off", "on"], default="off")
    ap.add_argument("--text", action="append", default=[], help="another reply to the first edit prompt")
    ap.add_argument("--replies", type=Path, help="replies and profile: read if the file exists, else written")
    args = ap.parse_args()
    lengths = [int(k) for k in args.lengths.split(",")]
    if args.replies and args.replies.exists():
        saved = json.loads(args.replies.read_text())
        compare({k: (v[0], v[1]) for k, v in saved["replies"].items()}, saved["profile"], lengths)
        return
    replies: dict[str, tuple[list[int], list[int]]] = {}
    with Session.open(args.model, ContextParams(n_ctx=4096, n_threads=args.threads,
                                                     flash_attn=args.flash_attn)) as s:
        for task, (make, _) in TASKS.items():
            for i, (text, instruction) in enumerate(make()):
                ask = f"{text}\n\n{instruction}".strip()
                prompt = chat_prompt(s.model, [{"role": "user", "content": ask}])
                greedy = SamplingParams(temperature=0, max_tokens=args.n)
                done = next(e for e in s.generate(prompt.tokens, greedy) if isinstance(e, Completion))
                replies[f"{task} {i + 1}"] = (prompt.tokens, done.tokens)
                if task == "edit" and i == 0:
                    measured: list[dict] = []
                    spec = Speculator(SpecParams(), on_measured=measured.append)
                    s.speculator = spec
                    next(e for e in s.generate(prompt.tokens, SamplingParams(temperature=0, max_tokens=2))
                         if isinstance(e, Completion))
                    s.speculator = None
                    profile = measured[0]
        for path in args.text:
            tokens = s.model.tokenize(Path(path).read_text(), add_special=False, parse_special=False)
            replies[f"edit 1: {Path(path).name}"] = (replies["edit 1"][0], tokens[:args.n])
    if args.replies:
        args.replies.write_text(json.dumps({"replies": replies, "profile": profile}))
    compare(replies, profile, lengths)


def compare(replies: dict[str, tuple[list[int], list[int]]], profile: dict, lengths: list[int]) -> None:
    one = profile["batch"]["1"]
    print("profile (cost of a step of n tokens, in single steps): "
          + ", ".join(f"{n}: {float(t) / one:.2f}" for n, t in sorted(profile["batch"].items(),
                                                                       key=lambda kv: int(kv[0]))))
    sides = {"auto": SpecParams(), **{f"fixed {k}": SpecParams(type="ngram", n_min=k, n_max=k)
                                      for k in lengths}}
    print(f"{'reply':<28}" + "".join(f"{name:>17}" for name in [*sides, "oracle"]))
    for name, (prompt, reply) in replies.items():
        cells = []
        for params in sides.values():
            speed, drafted, accepted = replay(prompt, reply, params, profile)
            cells.append(f"{speed:.3f} ({accepted}/{drafted})")
        speed, drafted, accepted = oracle(prompt, reply, SpecParams().n_max, profile)
        cells.append(f"{speed:.3f} ({accepted}/{drafted})")
        print(f"{name:<28}" + "".join(f"{c:>17}" for c in cells))


if __name__ == "__main__":
    main()
