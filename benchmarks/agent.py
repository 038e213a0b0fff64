"""An agent-shaped load: `infer serve` against llama.cpp's llama-server, same GGUF file and chat
template (issue 33).

    python benchmarks/agent.py [MODEL.gguf | smollm2] [--llama-bin DIR] [--rounds 3]
                               [--conversations 4] [--turns 6] [--max-tokens 64]

What a coding agent sends: a long system prompt (about 1,500 tokens of instructions) and 8
tools with JSON-schema parameters, then turn after turn of the same conversation, each
turn's history holding the earlier turns' tool calls and the tools' results. --conversations
such conversations run at once (one slot each), --turns turns each; every request is
streamed, `tool_choice: auto`, greedy, at most --max-tokens tokens.

Each turn's history is scripted (the assistant's call and the tool's result are the same
text whatever the model wrote), so both servers get byte-identical requests and the
comparison is of the servers, not of what a tiny model happened to write; the model's reply
is still generated, parsed for calls and streamed back, and the next turn's prompt extends
the last one as an agent's does (the slot's cache holds its prefix).

Both servers: the same file, template (--chat-template-file, default Qwen 3's, whose
`<tool_call>` JSON calls both read), -c cells as one KV pool for all slots (infer's server
always; llama-server -kvu), flash attention (--flash-attn, explicitly on both), 2 threads, no speculation, no
prompt cache beyond the slots' own (infer --no-cache, llama-server -cram 0), thinking off
(chat_template_kwargs). The order of the servers alternates between rounds; only one is
under load at a time. Measured by this client: the total wall time of all conversations and
the time to first token (first streamed delta of any kind: content, reasoning or call), p50
over all turns. Each round starts both servers afresh (a server that stops answering in a
round is reported and the round left out). Medians over rounds, and the ratios infer /
llama-server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import repacking
from serve import INFER, LLAMA_BIN, Server, resolve_model
from tiny_model import fixtures_dir

QWEN3 = fixtures_dir() / "chat-templates" / "Qwen-Qwen3-0.6B.jinja"

RULES = [
    "Read a file before you change it, and change only what the task needs.",
    "Run the tests after every change; a change whose tests fail is not done.",
    "Prefer the project's own helpers to new ones, and keep each function small.",
    "Never print secrets, tokens or passwords, even when a tool returns them.",
    "When a command fails, read its error, say what it means, and try one fix at a time.",
    "Ask before deleting a file, rewriting history, or installing a package.",
    "Quote the lines you change, with their file and line number, in your reply.",
    "Write commit messages that say what changed and why, in the imperative mood.",
]


def system_prompt() -> str:
    """About 1,500 tokens of an agent's standing instructions (the same text every run)."""
    parts = ["You are a coding agent working in a user's repository through the tools below."]
    for section in range(5):
        parts.append(f"\n## Part {section + 1}: working rules")
        parts += [f"{section + 1}.{i + 1}. {rule} This applies to every file in the repository, including "
                  f"generated ones, configuration and documentation." for i, rule in enumerate(RULES)]
    return "\n".join(parts)


def _tool(name: str, description: str, **params: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "required": list(params),
        "properties": {k: {"type": "integer"} if v == "integer" else {"type": "string", "description": v}
                       for k, v in params.items()}}}}


TOOLS = [
    _tool("read_file", "Read a file of the repository.", path="the file's path"),
    _tool("write_file", "Write a file (whole).", path="the file's path", content="its new content"),
    _tool("list_dir", "List a folder.", path="the folder's path"),
    _tool("search", "Search the repository for a regular expression.", pattern="the expression"),
    _tool("run_tests", "Run the test suite, or the tests matching a name.", filter="a test name or ''"),
    _tool("run_command", "Run a shell command in the repository.", command="the command"),
    _tool("git_diff", "Show the uncommitted changes.", path="a path or ''"),
    _tool("open_issue", "Read an issue of the tracker.", number="integer"),
]
ASKS = ["Find where the config file is parsed.",
        "Read that parser and tell me what it does with unknown keys.",
        "Make unknown keys an error that names the key.", "Run the tests of the parser.",
        "One test fails: read it and fix the code, not the test.", "Show me the diff and sum it up."]
CALLS = [("search", {"pattern": "def parse_config"}), ("read_file", {"path": "app/config.py"}),
         ("write_file", {"path": "app/config.py", "content": "def parse_config(text): ..."}),
         ("run_tests", {"filter": "config"}), ("read_file", {"path": "tests/test_config.py"}),
         ("git_diff", {"path": ""})]
RESULTS = ["app/config.py:12: def parse_config(text: str) -> Config:",
           "def parse_config(text):\n    data = toml.loads(text)\n"
           "    return Config(**{k: v for k, v in data.items() if k in FIELDS})",
           "written: 14 lines", "1 failed, 11 passed: test_unknown_key_is_an_error expects ConfigError",
           "def test_unknown_key_is_an_error():\n    with pytest.raises(ConfigError, match='colour'):\n"
           "        parse_config('colour = 1')",
           "--- a/app/config.py\n+++ b/app/config.py\n@@ -12,3 +12,6 @@\n+    unknown = set(data) - FIELDS"]


def history(conversation: int, turn: int) -> list[dict]:
    """The messages of `conversation` at `turn`: the system prompt, then each earlier turn's ask,
    the assistant's call and the tool's result, then this turn's ask."""
    messages: list[dict] = [{"role": "system", "content": system_prompt()}]
    for t in range(turn + 1):
        messages.append({"role": "user", "content": f"({conversation}) {ASKS[t % len(ASKS)]}"})
        if t == turn:
            break
        name, arguments = CALLS[t % len(CALLS)]
        call_id = f"call{conversation}x{t}"
        fn = {"name": name, "arguments": json.dumps(arguments)}
        call = {"id": call_id, "type": "function", "function": fn}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": RESULTS[t % len(RESULTS)]})
    return messages


async def turn(client: httpx.AsyncClient, server: Server, messages: list[dict], max_tokens: int) -> dict:
    """One streamed request: time to its first delta, its completion tokens, its calls."""
    body = {"messages": messages, "tools": TOOLS, "tool_choice": "auto", "temperature": 0, "stream": True,
            "max_tokens": max_tokens, "stream_options": {"include_usage": True},
            "chat_template_kwargs": {"enable_thinking": False}}
    try:
        return await _turn(client, server, body)
    except httpx.HTTPError as e:  # (the server died or dropped the connection)
        server.log.seek(0)
        raise Crashed(f"{server.name}: {type(e).__name__}: {e}; its last words:\n"
                      + "".join(server.log.readlines()[-5:])) from None


class Crashed(Exception):
    """A server stopped answering in the middle of a round."""


async def _turn(client: httpx.AsyncClient, server: Server, body: dict) -> dict:
    sent, first, usage, calls = time.perf_counter(), None, None, 0
    async with client.stream("POST", f"{server.url}/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            server.fail(f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:300]}")
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            event = json.loads(line[5:])
            usage = event.get("usage") or usage
            for choice in event.get("choices") or ():
                delta = choice.get("delta") or {}
                if first is None and (delta.get("content") or delta.get("reasoning_content")
                                      or delta.get("tool_calls")):
                    first = time.perf_counter()
                named = [c for c in delta.get("tool_calls") or () if (c.get("function") or {}).get("name")]
                calls += len(named)
    return {"ttft_ms": ((first or time.perf_counter()) - sent) * 1000,
            "tokens": (usage or {}).get("completion_tokens", 0), "calls": calls}


async def conversation(client: httpx.AsyncClient, server: Server, n: int,
                       args: argparse.Namespace) -> list[dict]:
    return [await turn(client, server, history(n, t), args.max_tokens) for t in range(args.turns)]


def measure(server: Server, args: argparse.Namespace) -> dict:
    async def all_of_them() -> list[list[dict]]:
        # (a connection for each request: llama-server's HTTP library closes a kept-alive
        # connection after 5 requests, and a request sent on it as it closes is lost)
        limits = httpx.Limits(max_connections=args.conversations, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=httpx.Timeout(900.0), limits=limits) as client:
            return await asyncio.gather(*(conversation(client, server, n, args)
                                          for n in range(args.conversations)))

    t0 = time.perf_counter()
    turns = [t for conv in asyncio.run(all_of_them()) for t in conv]
    return {"wall_s": time.perf_counter() - t0, "ttft_p50_ms": statistics.median(t["ttft_ms"] for t in turns),
            "tokens": sum(t["tokens"] for t in turns), "calls": sum(t["calls"] for t in turns)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="smollm2", help="a GGUF file (default: the embedded SmolLM2)")
    ap.add_argument("--llama-bin", type=Path, default=LLAMA_BIN, help="folder holding llama-server")
    ap.add_argument("--infer-cmd", default=shlex.join(INFER), help="how to run infer")
    ap.add_argument("--chat-template-file", type=Path, default=QWEN3)
    ap.add_argument("--flash-attn", choices=("on", "off"), default="off")
    ap.add_argument("--conversations", type=int, default=4)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=4096, help="context of each slot (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    model = resolve_model(args.model)
    common = ["-c", str(args.ctx * args.conversations), "-t", "2", "--chat-template-file",
              str(args.chat_template_file)]
    sides = {
        "infer serve": [*shlex.split(args.infer_cmd), "serve", model, "-np", str(args.conversations), *common,
                        "--flash-attn", args.flash_attn, "--spec-type", "none", "--no-cache", "--no-socket"],
        "llama-server": [str(args.llama_bin / "llama-server"), "-m", model, "-np", str(args.conversations),
                         *common, "--jinja", "-fa", args.flash_attn, "-kvu", "-cram", "0", "--no-webui",
                         *repacking.peer_args("llama-server")],
    }
    names = list(sides)
    rounds: list[dict[str, dict]] = []
    crashes = dict.fromkeys(names, 0)
    for r in range(args.rounds):  # (fresh servers each round: the rounds are alike, and a crash ends one)
        servers = [Server(name, sides[name]) for name in (names if r % 2 == 0 else names[::-1])]
        got: dict[str, dict] = {}
        try:
            for s in servers:
                s.wait_ready()
            for s in servers:
                try:
                    got[s.name] = measure(s, args)
                except Crashed as e:
                    crashes[s.name] += 1
                    print(f"round {r + 1}: {e}", file=sys.stderr)
        finally:
            for s in servers:
                s.stop()
        if len(got) == len(names):
            rounds.append(got)
            said = [f"{n} {got[n]['wall_s']:.1f} s ({got[n]['tokens']} tokens, {got[n]['calls']} calls)"
                    for n in names]
            print(f"round {r + 1}: " + "   ".join(said), file=sys.stderr)
    if not rounds:
        sys.exit(f"no round completed on both sides (crashes: {crashes})")
    keys = ("wall_s", "ttft_p50_ms")
    median = {n: {k: statistics.median(rd[n][k] for rd in rounds) for k in keys} for n in names}
    a, b = median["infer serve"], median["llama-server"]
    print(f"model: {model}\ntemplate: {args.chat_template_file.name}   {args.conversations} conversations x "
          f"{args.turns} turns   system prompt + 8 tools   max {args.max_tokens} tokens a turn   flash "
          f"attention {args.flash_attn}   medians of {len(rounds)} rounds"
          + (f"   (crashed in a round: {crashes})" if any(crashes.values()) else ""))
    print(repacking.line())
    print(f"{'':<22}{'total':>9}{'TTFT p50':>12}")
    for n in names:
        print(f"{n:<22}{median[n]['wall_s']:>7.1f} s{median[n]['ttft_p50_ms']:>9.0f} ms")
    print(f"{'infer / llama-server':<22}{a['wall_s'] / b['wall_s']:>8.2f}x"
          f"{a['ttft_p50_ms'] / b['ttft_p50_ms']:>11.2f}x   (time: lower is faster)")


if __name__ == "__main__":
    main()
