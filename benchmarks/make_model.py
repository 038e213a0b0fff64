"""Build the benchmark model: a random-weight llama with the real Llama 3 vocabulary, Q8_0
(or --type).

    python benchmarks/make_model.py OUT.gguf [--embd 768 --layers 12 --heads 12 --ff 2048]

The 156M-parameter model with a 32k vocabulary:

    python benchmarks/make_model.py OUT.gguf --vocab llama-spm --embd 1024 --layers 8 --heads 16 \
        --kv-heads 4 --ff 2816

A Llama 3.2 1B shape (1.2B parameters), for figures where the weights should dominate:

    python benchmarks/make_model.py OUT.gguf --embd 2048 --layers 16 --heads 32 --kv-heads 8 --ff 8192

About 270M parameters by default (the 128k-token vocabulary alone is 2 x 98M in the
embeddings and output). The F16 file is quantized to Q8_0 with llama.cpp's own
quantizer, through infer's quantize step.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from tiny_model import build_llama_gguf  # noqa: E402

from infer.quant.quantize import quantize  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--embd", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv-heads", type=int, default=0, help="default: a third of --heads")
    ap.add_argument("--ff", type=int, default=2048)
    ap.add_argument("--vocab", default="llama-bpe", help="a vocabulary of the fixtures: llama-bpe (128k), "
                    "llama-spm (32k)...")
    ap.add_argument("--type", default="Q8_0", help="quantization type (Q8_0, Q4_K_M, Q4_0...)")
    args = ap.parse_args()
    f16 = args.out.with_name(args.out.stem + "-f16.gguf")
    build_llama_gguf(f16, vocab=args.vocab, n_embd=args.embd, n_layer=args.layers,
                     n_head=args.heads, n_head_kv=args.kv_heads or args.heads // 3 or 1, n_ff=args.ff,
                     n_ctx_train=4096, f16=True)
    quantize(f16, args.out, args.type)
    f16.unlink()
    print(args.out)


if __name__ == "__main__":
    main()
