"""The child side of the repacking check (runtime/repack.py): load a small model whose
weights llama.cpp repacks, and run it.

Run as ``python -m infer.runtime.repack_probe FOLDER THREADS``. It writes a model into
FOLDER, loads it with llama.cpp's extra buffer types on, prefills 64 tokens and decodes two
with THREADS threads (as many as a real run uses, and at least two), and prints one JSON
line: the buffer types llama.cpp put weights in. Where ggml's repacked kernels are broken
on this CPU, the process dies (SIGILL in ggml's AMX code on some Intel Xeons) before it
prints; the parent sees the signal. Nothing here catches that crash: it is the answer.

The model is a llama architecture with a layer per weight type that some extra buffer
type takes (AMX: Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS; CPU_REPACK: Q4_0, Q8_0,
Q2_K, Q4_K, Q5_K, Q6_K, IQ4_NL, MXFP4 on AVX2 and NEON), in the shapes those kernels
accept (rows a multiple of 32, row length a multiple of 256). Its weights are zero: every
type encodes zero, and the check is whether the kernels run, not what they compute. Its
vocabulary is the smallest SentencePiece one llama.cpp loads (three specials and the 256
byte tokens, padded to 288), and the prompt is token ids, never text.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

N_EMBD = 256
N_FF = 512
N_HEAD = 4
N_VOCAB = 288
N_PROMPT = 64  # ggml's AMX kernels use tiles only for more than one row (a prefill)
N_DECODE = 2
# Weight types with repacked kernels somewhere, each given a layer (those this gguf
# package does not know are left out).
LAYER_TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q2_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4")
# Tests make the child die where a broken kernel would, to prove the fallback on any CPU.
CRASH_VARIABLE = "INFER_TEST_REPACK_CRASH"


def build_model(path: Path) -> list[str]:
    """Write the probe model to `path`; the weight types of its layers."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, LlamaFileType, TokenType

    types = [getattr(GGMLQuantizationType, name) for name in LAYER_TYPES
             if hasattr(GGMLQuantizationType, name)]
    writer = GGUFWriter(path, "llama")
    writer.add_name("infer-repack-probe")
    writer.add_context_length(256)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(len(types))
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(LlamaFileType.MOSTLY_Q4_0)
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    kinds = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL, *[TokenType.BYTE] * 256]
    tokens += [f"\u2581t{i}" for i in range(N_VOCAB - len(tokens))]
    kinds += [TokenType.NORMAL] * (N_VOCAB - len(kinds))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * N_VOCAB)
    writer.add_token_types(kinds)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)

    def zeros(name: str, rows: int, cols: int, qtype: GGMLQuantizationType) -> None:
        block, size = GGML_QUANT_SIZES[qtype]
        writer.add_tensor(name, np.zeros((rows, cols // block * size), dtype=np.uint8), raw_dtype=qtype)

    writer.add_tensor("token_embd.weight", np.full((N_VOCAB, N_EMBD), 0.01, dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    zeros("output.weight", N_VOCAB, N_EMBD, GGMLQuantizationType.Q4_0)
    for i, qtype in enumerate(types):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            zeros(f"blk.{i}.{name}.weight", N_EMBD, N_EMBD, qtype)
        zeros(f"blk.{i}.ffn_gate.weight", N_FF, N_EMBD, qtype)
        zeros(f"blk.{i}.ffn_up.weight", N_FF, N_EMBD, qtype)
        zeros(f"blk.{i}.ffn_down.weight", N_EMBD, N_FF, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return [t.name for t in types]


def run(path: Path, threads: int) -> list[str]:
    """Load the model at `path` with extra buffer types and run it; the buffers that held
    weights, as llama.cpp's load log names them ("AMX", "CPU_REPACK"...)."""
    import logging
    import re

    from infer.runtime import repack
    from infer.runtime.llama import Batch, Context, Model, init_backend
    from infer.runtime.params import ContextParams
    from infer.runtime.repack import Verdict

    buffers: list[str] = []
    pattern = re.compile(r"(\S+) model buffer size")

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            m = pattern.search(record.getMessage())
            if m and m.group(1) not in buffers:
                buffers.append(m.group(1))

    llama_log = logging.getLogger("infer.llama")
    llama_log.addHandler(Seen())
    llama_log.setLevel(logging.INFO)
    init_backend()
    params = ContextParams(n_ctx=128, n_batch=N_PROMPT, n_ubatch=N_PROMPT, n_threads=threads,
                           n_threads_batch=threads, flash_attn="off")
    repack.settle(Verdict(Verdict.WORKS, "this is the check"))  # (no check of the check)
    with Model(path, n_gpu_layers=0, devices=[]) as model, Context(model, params) as ctx:
        if os.environ.get(CRASH_VARIABLE):
            os.kill(os.getpid(), signal.SIGILL)
        batch = Batch(N_PROMPT)
        batch.set_tokens([3 + i % 256 for i in range(N_PROMPT)], start_pos=0)
        ctx.decode(batch)
        for step in range(N_DECODE):
            batch.set_one(3 + step, N_PROMPT + step)
            ctx.decode(batch)
        batch.close()
    return buffers


def main() -> None:
    try:
        import resource

        # A crash here is expected where the kernels are broken: no core file for it.
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ImportError, ValueError, OSError):  # (Windows has no resource module)
        pass
    folder, threads = Path(sys.argv[1]), int(sys.argv[2])
    path = folder / "repack-probe.gguf"
    types = build_model(path)
    buffers = run(path, threads)
    sys.stdout.write(json.dumps({"buffers": buffers, "types": types}) + "\n")


if __name__ == "__main__":
    main()
