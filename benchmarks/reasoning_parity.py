"""A thinking model's reply split as llama-server splits it: `infer serve` against llama.cpp's
llama-server on the same GGUF file, chat template and prompt, greedy, the same flash-attention
and repacking settings, streamed and not.

    python benchmarks/reasoning_parity.py [MODEL] --llama-bin "$(benchmarks/build_llama_tools.sh)"

For each case (a fixture template whose prompt opens the block, one whose model may open it,
the same with thinking off through chat_template_kwargs) both servers get the same request;
the script prints each side's `reasoning_content` and `content` and whether they are equal,
and exits 1 if any differ. tests/test_llama_server.py asserts the same on the embedded model
in the suite (the README's test command builds llama-server first); this script prints both
sides, for any model and either flash-attention setting.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import repacking
from serve import parity_parser, resolve_model, server_pair
from serve_helpers import reply_parts

TEMPLATES = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "chat-templates"
CASES = (  # (name, template, extra request fields)
    ("R1: the prompt opens the block", "llama-cpp-deepseek-r1.jinja", {}),
    ("Qwen 3: the model may open it", "Qwen-Qwen3-0.6B.jinja", {}),
    ("Qwen 3, thinking off", "Qwen-Qwen3-0.6B.jinja", {"chat_template_kwargs": {"enable_thinking": False}}),
)


def main() -> None:
    ap = parity_parser(__doc__)
    ap.add_argument("-n", "--max-tokens", type=int, default=48)
    ap.add_argument("--prompt", default="What is 2+2?")
    args = ap.parse_args()
    model = resolve_model(args.model)
    print(repacking.line())
    differ = 0
    for name, template_name, extra in CASES:
        payload = {"messages": [{"role": "user", "content": args.prompt}], "temperature": 0,
                   "max_tokens": args.max_tokens, **extra}
        with server_pair(args, model, TEMPLATES / template_name, "--reasoning-format", "deepseek") as servers:
            for stream in (False, True):
                got = {server.name: reply_parts(server.url, payload, stream=stream) for server in servers}
                same = len(set(got.values())) == 1
                differ += not same
                print(f"\n{name} ({'streamed' if stream else 'whole'}): {'same' if same else 'DIFFERENT'}")
                for side, (reasoning, content) in got.items():
                    print(f"  {side:<13} reasoning_content={reasoning!r}\n  {'':<13} content={content!r}")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
