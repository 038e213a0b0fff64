"""Conversion and quantization beside llama.cpp's own tools, on one ≥ 1 GB checkpoint.

    python benchmarks/convert.py WORKDIR [--llama-src DIR] [--llama-bin DIR]

Builds (once) a random-weight Llama checkpoint of about 1B parameters in BF16 on the
spm-32k fixture tokenizer, then measures, each in its own process with
``/usr/bin/time``-style accounting (wall time and peak resident memory):
- infer's converter (``infer.quant.convert``) to F16;
- llama.cpp's ``convert_hf_to_gguf.py`` to F16 (from the llama-cpp-python source
  distribution, ``--llama-src``; run as a peer, nothing copied from it);
- infer's quantizer (``infer.quant.quantize``, a child process) F16 -> Q4_K_M;
- llama.cpp's ``llama-quantize`` F16 -> Q4_K_M (``--llama-bin``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def build_checkpoint(folder: Path) -> Path:
    if (folder / "config.json").is_file():
        return folder
    code = f"""
import shutil, torch, transformers
from pathlib import Path
config = transformers.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
    num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=4,
    max_position_embeddings=2048, tie_word_embeddings=False)
config.architectures = ["LlamaForCausalLM"]
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
model.save_pretrained({str(folder)!r}, safe_serialization=True, max_shard_size="1GB")
tok = Path({str(REPO.parent / 'shared' / 'fixtures' / 'tokenizers' / 'spm-32k')!r})
for f in tok.iterdir():
    shutil.copy(f, Path({str(folder)!r}) / f.name)
"""
    subprocess.run([sys.executable, "-c", code], check=True)
    return folder


def measured(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of a child process."""
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env={**os.environ, **(env or {})},
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    # The maximum over all waited-for children: each measurement runs in a fresh Python
    # (--child) whose only child is the measured command.
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, peak / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workdir", type=Path)
    ap.add_argument("--llama-src", type=Path, help="vendor/llama.cpp of the llama-cpp-python sdist")
    ap.add_argument("--llama-bin", type=Path, help="folder holding llama-quantize")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # a JSON list: the command to measure
    args = ap.parse_args()
    if args.child:
        wall, peak = measured(json.loads(args.child))
        print(f"{wall:.2f} {peak:.0f}")
        return
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    ckpt = build_checkpoint(work / "hf-1b")
    size = sum(p.stat().st_size for p in ckpt.glob("*.safetensors"))
    rows = []

    def run(label: str, cmd: list[str]) -> None:
        out = subprocess.run([sys.executable, __file__, str(work), "--child", json.dumps(cmd)],
                             capture_output=True, text=True, check=True, env=os.environ)
        wall, peak = out.stdout.split()
        rows.append((label, float(wall), float(peak)))

    ours = work / "infer-f16.gguf"
    run("infer convert (F16)", [sys.executable, "-c",
        f"from pathlib import Path; from infer.quant.convert import convert; "
        f"convert(Path({str(ckpt)!r}), Path({str(ours)!r}), out_type='F16')"])
    if args.llama_src:
        peer = work / "llama-f16.gguf"
        run("convert_hf_to_gguf.py (F16)", [sys.executable, str(args.llama_src / "convert_hf_to_gguf.py"),
                                            str(ckpt), "--outtype", "f16", "--outfile", str(peer)])
    run("infer quantize F16->Q4_K_M", [sys.executable, "-c",
        f"from pathlib import Path; from infer.quant.quantize import quantize; "
        f"quantize(Path({str(ours)!r}), Path({str(work / 'infer-q4.gguf')!r}), 'Q4_K_M')"])
    if args.llama_bin:
        run("llama-quantize F16->Q4_K_M", [str(args.llama_bin / "llama-quantize"), str(ours),
                                           str(work / "llama-q4.gguf"), "Q4_K_M"])
    print(f"checkpoint: {size / 1e9:.2f} GB of BF16 safetensors, {os.cpu_count()} cores")
    print(f"{'step':<30} {'wall s':>8} {'peak RSS MB':>12}")
    for label, wall, peak in rows:
        print(f"{label:<30} {wall:>8.1f} {peak:>12.0f}")


if __name__ == "__main__":
    main()
