"""What the tiny projectors (tiny_vision.py, tiny_audio.py) share: an mmproj GGUF of random
F32 weights, written through a temporary name, and the pre-norm transformer blocks of their
encoders (clip.cpp's names: PREFIX.N.ln1, attn_q/k/v/out, ln2, ffn_up/down, with biases)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFType, GGUFWriter, LlamaFileType


class MmprojFile:
    """An mmproj GGUF being written: `writer` for its keys, `tensor` and `blocks` for its
    weights (drawn from one seeded generator, in the order they are added), `write` to finish."""

    def __init__(self, out: Path, name: str, seed: int) -> None:
        self.out, self.tmp = out, out.with_name(out.name + ".tmp")
        self.writer = GGUFWriter(self.tmp, "clip")
        self.writer.add_type(GGUFType.MMPROJ)
        self.writer.add_name(name)
        self.writer.add_file_type(LlamaFileType.ALL_F32)
        self.rng = np.random.default_rng(seed)

    def tensor(self, name: str, shape: tuple[int, ...], scale: float = 0.02,
               fill: float | None = None) -> None:
        """numpy shapes are GGUF's (ne0, ne1, ...) reversed; a Linear's weight is (out, in)."""
        if fill is not None:
            data = np.full(shape, fill, dtype=np.float32)
        else:
            data = self.rng.standard_normal(shape, dtype=np.float32) * scale
        self.writer.add_tensor(name, data)

    def blocks(self, prefix: str, n_layer: int, n_embd: int, n_ff: int, *, k_bias: bool = True) -> None:
        """`n_layer` encoder blocks named PREFIX.N.* (`k_bias` False: Whisper's key has none)."""
        for b in range(n_layer):
            p = f"{prefix}.{b}"
            self.tensor(f"{p}.ln1.weight", (n_embd,), fill=1.0)
            self.tensor(f"{p}.ln1.bias", (n_embd,), fill=0.0)
            for proj in ("attn_q", "attn_k", "attn_v", "attn_out"):
                self.tensor(f"{p}.{proj}.weight", (n_embd, n_embd))
                if proj != "attn_k" or k_bias:
                    self.tensor(f"{p}.{proj}.bias", (n_embd,))
            self.tensor(f"{p}.ln2.weight", (n_embd,), fill=1.0)
            self.tensor(f"{p}.ln2.bias", (n_embd,), fill=0.0)
            self.tensor(f"{p}.ffn_up.weight", (n_ff, n_embd))
            self.tensor(f"{p}.ffn_up.bias", (n_ff,))
            self.tensor(f"{p}.ffn_down.weight", (n_embd, n_ff))
            self.tensor(f"{p}.ffn_down.bias", (n_embd,))

    def write(self) -> Path:
        """The file complete, renamed into place."""
        self.writer.write_header_to_file()
        self.writer.write_kv_data_to_file()
        self.writer.write_tensors_to_file()
        self.writer.close()
        self.tmp.replace(self.out)
        return self.out
