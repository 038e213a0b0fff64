"""Speculative decoding: decode speed with and without, beside llama.cpp's llama-lookup.

    python benchmarks/speculative.py MODEL.gguf --llama-bin DIR [-t 2] [--rounds 3]
                                     [--lookup-n 2,3,4,6,8] [--tasks edit,extract,open,batch]

Three tasks, each a few chat prompts (variants) rendered with the model's template (the
same text goes to both tools): ``edit`` (rename a variable in a 100-line function and
print it whole: the reply repeats its input), ``extract`` (quote sentences from a
document), ``open`` (open-ended writing). For each task and round, prompt by prompt,
every side in turn (in alternating order):

- ``infer run`` with --spec-type none, and with the default settings (auto: prompt
  lookup, cost-aware draft length);
- ``llama-lookup`` (prompt lookup, a fixed draft length) at 0 (its plain decoding
  loop, the baseline of its speed-ups) and at each length of --lookup-n.

A side's speed in a round is its generated tokens over its decode seconds, summed over
the task's variants. Why variants: the verification batches round differently from
single steps (llama.cpp uses other kernels for them), so with speculation a small
model's greedy reply can part from its reply without, early, and go on differently,
for infer and llama-lookup alike (each draft length of llama-lookup writes its own
text). One prompt would compare one draw of that lottery per side; several average it.

With ``batch`` in --tasks, the scheduler (``infer batch``) too: six requests (two of
each task), at each --parallel of --batch-parallel, without speculation and with the
default (cost-aware prompt lookup per slot), in one process, alternating; generated
tokens/s over the whole batch and the ratio.

All greedy, one thread count, the same flash-attention setting everywhere (--flash-attn:
off by default, infer's CPU default; llama.cpp's differs and changes the rounding).
infer runs in a fresh INFER_HOME: its first speculating run measures the cost profile
(counted in prefill, not decode).
Decode tokens/s are medians over the rounds; speed-ups are each tool's over its own
plain decoding in the same round, medians over the rounds (since 2026-12-05; before,
ratios of the medians); the last line divides infer's speed-up by llama-lookup's at its
best fixed length. Since the night of 2026-12-05 a round runs prompt by prompt, so that
each side runs within a minute of the plain loops it is compared with (before, side by
side over all prompts: a side and its baseline up to five sides, minutes, apart).
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
from functools import partial
from pathlib import Path

import repacking

INFER = [str(Path(sys.executable).parent / "infer")]  # the console script beside this Python
GPU: list[str] = []  # -ngl N for both tools (--ngl)
FA = ["-fa", "off"]  # the same flash-attention setting for both tools (--flash-attn)


def _function(name: str, args: str, doc: str, setup: list[str], fields: list[str],
              body: list[str], tail: list[str]) -> str:
    """A function of about 100 lines: a block of `body` lines per field ({f} the field)."""
    lines = [f"def {name}({args}):", f'    """{doc}"""', *setup]
    for field in fields:
        lines += [line.format(f=field) for line in body]
    lines += tail
    assert len(lines) >= 95, (name, len(lines))
    return "\n".join(lines)


FRUITS = ["apples", "pears", "plums", "grapes", "lemons", "limes", "melons", "cherries", "peaches",
          "apricots", "figs", "dates", "kiwis", "mangoes", "papayas", "guavas", "lychees", "olives"]
SENSORS = ["boiler", "chiller", "pump_a", "pump_b", "fan_north", "fan_south", "valve_1", "valve_2",
           "tank_level", "inlet", "outlet", "compressor", "dryer", "heater", "condenser", "filter",
           "mixer", "conveyor", "press", "oven"]
RESOURCES = ["users", "orders", "invoices", "products", "carts", "payments", "refunds", "reviews",
             "coupons", "addresses", "shipments", "returns", "stores", "suppliers", "warehouses",
             "categories", "tags", "images", "sessions", "tokens", "reports", "alerts", "audits",
             "exports"]
SETTINGS = ["host", "port", "user", "password", "timeout", "retries", "backoff", "log_level",
            "cache_dir", "workers", "queue_size", "tls_cert", "tls_key", "region", "bucket",
            "endpoint", "proxy", "locale", "theme", "editor", "shell", "pager", "history"]


def edit_tasks() -> list[tuple[str, str]]:
    inventory = _function(
        "summarize_inventory", "items, warehouse, threshold",
        "Totals, shortages and a report for one warehouse.",
        ["    total = 0", "    shortages = []", "    report = []"], FRUITS,
        ['    count_{f} = items.get("{f}", 0)', "    total += count_{f}", "    if count_{f} < threshold:",
         '        shortages.append(("{f}", threshold - count_{f}))',
         '    report.append(f"{f}: {{count_{f}}} in {{warehouse}}")'],
        ['    report.append(f"total: {total}")', '    return total, shortages, "\\n".join(report)'])
    config = _function(
        "check_config", "config, strict", "Every setting's problems, and the settings that are valid.",
        ["    errors = []", "    valid = {}"], SETTINGS,
        ['    value = config.get("{f}")', "    if value is None and strict:",
         '        errors.append("missing setting: {f}")', "    elif value is not None:",
         '        valid["{f}"] = value'],
        ["    if errors and strict:", '        raise ValueError("; ".join(errors))',
         "    return valid, errors"])
    sensors = _function(
        "sensor_summary", "readings, limits", "The mean of every sensor's readings, and its alarms.",
        ["    means = {}", "    alarms = []"], SENSORS,
        ['    values = readings.get("{f}", [])', "    if values:",
         '        means["{f}"] = sum(values) / len(values)',
         '        if max(values) > limits.get("{f}", float("inf")):',
         '            alarms.append("{f}")'],
        ["    return means, alarms"])
    routes = _function(
        "build_routes", "app, prefix", "Register a handler for every resource under the prefix.",
        ["    routes = []"], RESOURCES,
        ['    path = prefix + "/{f}"', '    handler = app.handlers["{f}"]',
         '    app.add_route(path, handler, methods=["GET", "POST"])',
         '    routes.append(path)'],
        ["    app.log(len(routes))", "    return routes"])
    return [(inventory, "Rename the variable total to grand_total in this function and print the "
                        "whole function."),
            (config, "Rename the variable errors to problems in this function and print the whole "
                     "function."),
            (sensors, "Rename the variable alarms to warnings in this function and print the whole "
                      "function."),
            (routes, "Rename the variable routes to paths in this function and print the whole "
                     "function.")]


def extract_tasks() -> list[tuple[str, str]]:
    bridge = [
        "The bridge opened in 1932 after six years of construction.",
        "Its main span is 503 metres long and carries eight lanes of traffic.",
        "Workers painted the steel arch with a grey primer every ten years.",
        "In 1998 a railway line was added beside the road deck.",
        "The toll was abolished in 2005, when the city paid off the last bonds.",
        "Tourists can climb the arch on guided walks that take three hours.",
        "A storm in 2011 closed the bridge for two days, the longest closure in its history.",
        "The lamps along the deck were replaced with LEDs in 2016.",
        "Engineers inspect the bearings every spring with ultrasound.",
        "The bridge appears on the city's coat of arms and on its bus tickets.",
    ]
    library = [
        "The library was founded in 1887 by a group of shipbuilders.",
        "Its reading room seats two hundred people under a glass dome.",
        "A fire in 1923 destroyed the west wing and nine thousand books.",
        "The rebuilt wing opened in 1927 with a children's section.",
        "Since 1964 the library has kept the city's newspaper archive.",
        "Volunteers repair old bindings every Thursday evening.",
        "The catalogue went online in 2001, and lending machines came in 2014.",
        "The dome was cleaned for the first time in 2019.",
    ]
    ask = ("Quote, word for word, every sentence of this text that contains a year, one per line, "
           "in the order they appear.")
    return [(" ".join(bridge * 2), ask), (" ".join(library * 2), ask)]


def open_tasks() -> list[tuple[str, str]]:
    return [("", "Write a long story about a lighthouse keeper who finds a message in a bottle."),
            ("", "Write an essay about why cities plant trees along their streets.")]


TASKS = {"edit": (edit_tasks, 512), "extract": (extract_tasks, 512), "open": (open_tasks, 384)}


def render(model: str, text: str, instruction: str) -> str:
    out = subprocess.run([*INFER, "run", model, instruction,
                          "--show-prompt", "--no-cache"], input=text, capture_output=True, text=True,
                         check=True)
    return out.stdout  # the template ends with "assistant\n": printed as is


def run_infer(model: str, text: str, instruction: str, n: int, threads: int, extra: list[str]) -> dict:
    cmd = [*INFER, "run", model, instruction, "--json", "--temp", "0",
           "-n", str(n), "-t", str(threads), *FA, "--no-cache", "-c", "4096", *GPU, *extra]
    out = subprocess.run(cmd, input=text, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"infer failed: {out.stderr[-2000:]}")
    r = json.loads(out.stdout)
    u = r["usage"]
    return {"seconds": r["timings"]["decode_ms"] / 1000, "tokens": u["completion_tokens"],
            "drafted": u["draft_tokens"], "accepted": u["accepted_tokens"], "text": r["text"]}


def run_lookup(binary: Path, model: str, prompt_file: str, n: int, threads: int, k: int) -> dict:
    cmd = [str(binary), "-m", model, "-f", prompt_file, "-n", str(n), "-t", str(threads), "--temp", "0",
           *FA, "-c", "4096", "--spec-draft-n-max", str(k), *GPU, *repacking.peer_args("llama-lookup")]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"llama-lookup failed: {out.stderr[-2000:]}")
    err = out.stderr
    m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", err)
    drafted = re.search(r"n_drafted\s+=\s+(\d+)", err)
    accepted = re.search(r"n_accept\s+=\s+(\d+)", err)
    if not m:
        raise SystemExit(f"llama-lookup printed no timing: {err[-2000:]}")
    return {"seconds": float(m.group(2)), "tokens": int(m.group(1)),
            "drafted": int(drafted.group(1)) if drafted else 0,
            "accepted": int(accepted.group(1)) if accepted else 0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--llama-bin", default=os.environ.get("LLAMA_BIN"),
                    required=not os.environ.get("LLAMA_BIN"))
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lookup-n", default="2,3,4,6,8")
    ap.add_argument("--tasks", default="edit,extract,open,batch")
    ap.add_argument("--batch-parallel", default="1,2,4,8")
    ap.add_argument("--infer-extra", default="", help="more infer run flags for the speculating side")
    ap.add_argument("--infer", help="the infer command (default: the console script beside this Python)")
    ap.add_argument("--ngl", help="-ngl for both tools (layers on the GPU)")
    ap.add_argument("--flash-attn", choices=["off", "on"], default="off",
                    help="flash attention for both tools (off: infer's CPU default)")
    args = ap.parse_args()
    if args.infer:
        INFER[:] = args.infer.split()
    if args.ngl:
        GPU[:] = ["-ngl", args.ngl]
    FA[1] = args.flash_attn
    os.environ["INFER_HOME"] = tempfile.mkdtemp(prefix="infer-bench-")
    lookup = Path(args.llama_bin) / "llama-lookup"
    print(repacking.line())
    ks = [int(k) for k in args.lookup_n.split(",")]
    for task in args.tasks.split(","):
        if task == "batch":
            batch_section(args)
            continue
        make, n = TASKS[task]
        runners: dict[str, list] = {"infer none": [], "infer auto": []}
        runners.update({f"lookup {k}": [] for k in [0, *ks]})
        files = []
        for text, instruction in make():
            with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
                f.write(render(args.model, text, instruction))
            files.append(f.name)
            runners["infer none"].append(partial(run_infer, args.model, text, instruction, n, args.threads,
                                                 ["--spec-type", "none"]))
            runners["infer auto"].append(partial(run_infer, args.model, text, instruction, n, args.threads,
                                                 args.infer_extra.split()))
            for k in [0, *ks]:
                runners[f"lookup {k}"].append(partial(run_lookup, lookup, args.model, f.name, n,
                                                      args.threads, k))
        names = list(runners)
        speeds: dict[str, list[float]] = {name: [] for name in names}
        last: dict[str, list[dict]] = {name: [{}] * len(files) for name in names}
        for r in range(args.rounds):
            # Prompt by prompt, every side in turn (the order reversed every other time): a
            # side and the plain loop it is compared with run within a minute of each other,
            # so that the machine's drift over a round's minutes does not enter the speed-ups.
            tokens = dict.fromkeys(names, 0)
            seconds = dict.fromkeys(names, 0.0)
            for i in range(len(files)):
                for name in (names if (r + i) % 2 == 0 else names[::-1]):
                    run = runners[name][i]()
                    tokens[name] += run["tokens"]
                    seconds[name] += run["seconds"]
                    last[name][i] = run
            for name in names:
                speeds[name].append(tokens[name] / seconds[name])
        for path in files:
            os.unlink(path)
        med = {name: statistics.median(v) for name, v in speeds.items()}

        def base_of(name: str) -> str:
            return "infer none" if name.startswith("infer") else "lookup 0"

        # Each side's speed-up over its own plain decoding in the same round (the machine's
        # speed drifts over a round's minutes less than over the whole run), median of rounds.
        gain = {name: statistics.median(s / b for s, b in zip(speeds[name], speeds[base_of(name)],
                                                              strict=True))
                for name in names}
        best_k = max(ks, key=lambda k: gain[f"lookup {k}"])
        print(f"\n## {task} ({len(files)} prompts, {args.rounds} rounds, {args.threads} threads, -n {n})")
        print(f"{'side':<12} {'tok/s':>8} {'speed-up':>9} {'tokens':>7} {'drafted':>8} {'accepted':>9}")
        for name in names:
            runs = last[name]
            print(f"{name:<12} {med[name]:8.1f} {gain[name]:9.3f} {sum(x['tokens'] for x in runs):7d} "
                  f"{sum(x['drafted'] for x in runs):8d} {sum(x['accepted'] for x in runs):9d}")
        for i, (plain, spec) in enumerate(zip(last["infer none"], last["infer auto"], strict=True)):
            a, b = plain["text"], spec["text"]
            at = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            print(f"prompt {i + 1}: infer auto's text " + ("equals infer none's" if a == b else
                  f"parts from infer none's at character {at} of {len(a)}"))
        ours, theirs = gain["infer auto"], gain[f"lookup {best_k}"]
        print(f"infer auto speed-up {ours:.3f}; llama-lookup at its best ({best_k}) {theirs:.3f}; "
              f"ratio {ours / theirs:.3f}")
        sys.stdout.flush()


def batch_section(args: argparse.Namespace) -> None:
    """The scheduler with and without speculation, at each --parallel, in this process."""
    import time

    from infer.runtime.llama import Context, Model
    from infer.runtime.params import ContextParams
    from infer.runtime.prompt import chat_prompt
    from infer.runtime.request import Request
    from infer.runtime.sampling import SamplingParams
    from infer.runtime.scheduler import Scheduler
    from infer.runtime.speculative import SpecParams

    n = 160
    params = SamplingParams(temperature=0.0, max_tokens=n)
    asks = [f"{text}\n\n{instruction}".strip()  # as infer run puts piped text and PROMPT
            for make, _ in TASKS.values() for text, instruction in make()[:2]]
    sides = {"none": None, "auto": SpecParams()}
    with Model(args.model) as model:
        prompts = [chat_prompt(model, [{"role": "user", "content": a}]).tokens for a in asks]
        print(f"\n## batch ({len(prompts)} requests of at most {n} tokens: two per task; "
              f"{args.rounds} rounds, {args.threads} threads)")
        print(f"{'parallel':>8} {'none tok/s':>11} {'auto tok/s':>11} {'ratio':>7} {'drafted':>8} "
              f"{'accepted':>9}")
        for parallel in [int(p) for p in args.batch_parallel.split(",")]:
            cparams = ContextParams(n_ctx=(parallel + 1) * (max(map(len, prompts)) + n + 16),
                                    n_seq_max=parallel + 1, n_threads=args.threads,
                                    flash_attn=args.flash_attn)
            speeds: dict[str, list[float]] = {}
            counts = (0, 0)
            with Context(model, cparams) as ctx:
                for r in range(args.rounds):
                    for name in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
                        scheduler = Scheduler(model, ctx, parallel=parallel, speculation=sides[name])
                        t0 = time.perf_counter()
                        done = [o.completion for o in scheduler.run(
                            Request(i, t, params) for i, t in enumerate(prompts)) if o.completion]
                        seconds = time.perf_counter() - t0
                        scheduler.close()
                        speeds.setdefault(name, []).append(sum(c.usage.completion_tokens for c in done)
                                                           / seconds)
                        if name == "auto":
                            counts = (sum(c.usage.draft_tokens for c in done),
                                      sum(c.usage.accepted_tokens for c in done))
            none, auto = (statistics.median(speeds[k]) for k in ("none", "auto"))
            ratios = statistics.median(a / b for a, b in zip(speeds["auto"], speeds["none"], strict=True))
            print(f"{parallel:8d} {none:11.1f} {auto:11.1f} {ratios:7.3f} {counts[0]:8d} {counts[1]:9d}")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
