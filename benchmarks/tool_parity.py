"""Tool calls with `tool_choice: required`, infer serve against llama.cpp's llama-server, on the
same GGUF file, chat template and request (greedy, the same flash-attention and repacking
settings): for each chat template, whether both return a call, and the same one.

    python benchmarks/tool_parity.py [MODEL] --llama-bin "$(benchmarks/build_llama_tools.sh llama-server)"

Templates: the shared fixtures' and tests/chat_templates' that infer reads calls from
(runtime/tool_syntax.learn). A template llama-server does not take (it answers 4xx/5xx or
returns no call) is reported as such. The two grammars differ (llama.cpp writes its own per
format), so a small model may pick other arguments under each: the script reports the calls
side by side; it is a survey, not a test.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import repacking
from serve import Server, parity_parser, resolve_model, server_pair
from tiny_model import fixtures_dir

from infer.runtime.tool_syntax import learn

HERE = Path(__file__).resolve().parents[1] / "tests" / "chat_templates"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "required": ["city"],
                   "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]}}}}}]


def templates() -> list[Path]:
    found = sorted((fixtures_dir() / "chat-templates").glob("*.jinja")) + sorted(HERE.glob("*.jinja"))
    return [p for p in found if learn(p.read_text(encoding="utf-8"), bos_token="<s>", eos_token="</s>")]


def ask(server: Server) -> tuple[str, list[tuple[str, object]]]:
    """(an error or "", the calls (name, arguments)) of one required-call request."""
    body = {"messages": [{"role": "user", "content": "What is the weather in Paris?"}], "tools": TOOLS,
            "tool_choice": "required", "temperature": 0, "max_tokens": 200, "parallel_tool_calls": False}
    try:
        r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300)
    except httpx.HTTPError as e:
        return f"no answer ({type(e).__name__})", []
    if r.status_code != 200:
        return f"{r.status_code}: {r.text[:120]}", []
    calls = r.json()["choices"][0]["message"].get("tool_calls") or []
    out = []
    for c in calls:
        try:
            out.append((c["function"]["name"], json.loads(c["function"]["arguments"])))
        except ValueError:
            out.append((c["function"]["name"], c["function"]["arguments"]))
    return "", out


def main() -> None:
    ap = parity_parser(__doc__)
    ap.add_argument("--only", default="", help="only templates whose file name contains this")
    args = ap.parse_args()
    model = resolve_model(args.model)
    print(repacking.line())
    same = both = 0
    chosen = [t for t in templates() if args.only in t.name]
    for template in chosen:
        with server_pair(args, model, template) as servers:
            got = {server.name: ask(server) for server in servers}
        (ours_error, ours), (theirs_error, theirs) = got["infer serve"], got["llama-server"]
        both += bool(ours and theirs)
        same += bool(ours) and ours == theirs
        verdict = "same" if ours and ours == theirs else "different" if ours and theirs else "one side"
        print(f"{template.stem:<48} {verdict:<9} infer: {ours_error or ours}\n{'':<58} llama-server: "
              f"{theirs_error or theirs}")
    print(f"\n{len(chosen)} templates: both returned a call for {both}, the same call for {same}")


if __name__ == "__main__":
    main()
