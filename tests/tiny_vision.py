"""Build a small, real, runnable multimodal projector (an ``mmproj`` GGUF) with random weights,
and small PNG images to feed it.

The projector is LLaVA-1.5's (``clip.projector_type`` "mlp"): a CLIP ViT (patch conv, learned
position embeddings, a class embedding, pre-layernorm, pre-norm blocks with biased q/k/v/out and
a GELU-quick FFN) followed by a two-layer GELU MLP into the text model's embedding size. It is
the plainest type libmtmd knows: fixed-size preprocessing (the image is padded to a square and
resized to ``image_size``; no tiles, no slices), no begin/end-of-image marker tokens around the
embeddings, causal decoding, ordinary positions (no M-RoPE). The key and tensor names are
llama.cpp's ``tools/mtmd/clip-impl.h`` (KEY_* and TN_*), read by ``clip_model_loader`` in
``tools/mtmd/clip.cpp``; the graph is ``tools/mtmd/models/llava.cpp``; gguf-py's
``TENSOR_NAMES`` (MODEL_TENSOR.V_*) spell the same names.

An image becomes ``(image_size // patch_size) ** 2`` embeddings: 16 with the defaults (32x32
pixels, 8x8 patches), whatever the picture's own size. As in LLaVA, the features come from the
next-to-last vision block, so with ``n_layer=2`` one block runs. The output size
(``clip.vision.projection_dim`` and ``mm.2``'s rows) must equal the text model's ``n_embd``
(``build_llama_gguf``'s, 64 by default), or ``mtmd_init_from_file`` refuses the pair.
Used by the test fixtures next to ``tiny_model.build_llama_gguf``.
"""

from __future__ import annotations

import random
import struct
import zlib
from pathlib import Path

from tiny_mmproj import MmprojFile

# CLIP's (OpenAI) normalization, as the LLaVA-1.5 mmproj files carry it.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def image_tokens(image_size: int = 32, patch_size: int = 8) -> int:
    """How many embeddings (text positions) one image becomes with `build_mmproj_gguf`'s file."""
    return (image_size // patch_size) ** 2


def build_mmproj_gguf(
    out: Path,
    *,
    n_embd_text: int = 64,
    image_size: int = 32,
    patch_size: int = 8,
    n_embd: int = 32,
    n_layer: int = 2,
    n_head: int = 2,
    n_ff: int = 64,
    seed: int = 0,
) -> Path:
    """Write a random-weight LLaVA-style ("mlp") vision projector to `out`, its output
    embeddings `n_embd_text` wide (the text model's ``n_embd``)."""
    if image_size % patch_size:
        raise ValueError(f"image_size {image_size} is not a multiple of patch_size {patch_size}")
    if n_embd % n_head:
        raise ValueError(f"n_embd {n_embd} is not a multiple of n_head {n_head}")
    if n_ff == n_embd:
        # clip.cpp takes an ffn_down whose first dimension is n_embd for an old, swapped export.
        raise ValueError("n_ff must differ from n_embd")
    n_pos = image_tokens(image_size, patch_size) + 1  # the patches and the class embedding

    f = MmprojFile(out, "tiny-llava-mmproj", seed)
    writer, tensor = f.writer, f.tensor
    writer.add_clip_has_vision_encoder(True)
    writer.add_clip_projector_type("mlp")
    writer.add_vision_image_size(image_size)
    writer.add_vision_patch_size(patch_size)
    writer.add_vision_embedding_length(n_embd)
    writer.add_vision_feed_forward_length(n_ff)
    writer.add_vision_block_count(n_layer)
    writer.add_vision_head_count(n_head)
    writer.add_vision_attention_layernorm_eps(1e-5)
    writer.add_vision_projection_dim(n_embd_text)
    writer.add_vision_image_mean(list(CLIP_MEAN))
    writer.add_vision_image_std(list(CLIP_STD))
    writer.add_vision_use_gelu(False)  # CLIP's quick GELU in the blocks (the MLP uses GELU)

    tensor("v.patch_embd.weight", (n_embd, 3, patch_size, patch_size))  # conv2d, no bias
    tensor("v.class_embd", (n_embd,))
    tensor("v.position_embd.weight", (n_pos, n_embd))
    tensor("v.pre_ln.weight", (n_embd,), fill=1.0)
    tensor("v.pre_ln.bias", (n_embd,), fill=0.0)
    f.blocks("v.blk", n_layer, n_embd, n_ff)
    # The projector: mm.0 (vision -> text width), GELU, mm.2 (text -> text width).
    tensor("mm.0.weight", (n_embd_text, n_embd), scale=0.2)
    tensor("mm.0.bias", (n_embd_text,))
    tensor("mm.2.weight", (n_embd_text, n_embd_text), scale=0.2)
    tensor("mm.2.bias", (n_embd_text,))
    return f.write()


def png_bytes(width: int, height: int, seed: int = 0) -> bytes:
    """A valid 8-bit RGB PNG of random pixels (standard library only: zlib and struct)."""
    rng = random.Random(seed)
    # Each scanline is preceded by its filter type (0: none).
    raw = b"".join(b"\x00" + rng.randbytes(width * 3) for _ in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8 bits, RGB, no interlace
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def write_png(path: Path, width: int = 48, height: int = 40, seed: int = 0) -> Path:
    """Write `png_bytes` to `path` (via a temporary name) and return it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(png_bytes(width, height, seed))
    tmp.replace(path)
    return path
