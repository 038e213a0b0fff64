"""Build a small, real, runnable audio projector (an ``mmproj`` GGUF) with random weights,
and short WAV files to feed it.

The projector is Ultravox's (``clip.projector_type`` "ultravox"): a Whisper encoder (two
conv1d layers over the log-mel spectrogram, the second with stride 2, GELU after each; learned
position embeddings; pre-norm blocks with biased q/v/out, an unbiased k and a GELU FFN; a final
layernorm) whose outputs are stacked ``stack_factor`` at a time and projected by an RMSNorm,
SwiGLU, RMSNorm, linear MLP into the text model's embedding size. Among the audio types libmtmd
knows it is the plainest for a test: the whole projector is four tensors, no begin/end-of-audio
marker text is put around the embeddings (Qwen2-Audio's "qwen2a", two tensors fewer, wraps
them in ``<|audio_bos|>``/``<|audio_eos|>``, which a llama vocabulary tokenizes as plain text),
causal decoding and ordinary positions. The key and tensor names are llama.cpp's
``tools/mtmd/clip-impl.h`` (KEY_* and TN_*), read by ``clip_model_loader`` in
``tools/mtmd/clip.cpp``; the graph is ``tools/mtmd/models/whisper-enc.cpp``; the preprocessing
is ``mtmd_audio_preprocessor_whisper`` in ``tools/mtmd/mtmd-audio.cpp``; gguf-py's
``TENSOR_NAMES`` (MODEL_TENSOR.A_*) spell the same names.

As in Whisper, the audio (resampled to 16 kHz mono by libmtmd) is padded with 30 s of silence
and cut into 30 s windows of 3000 mel frames (only whole windows are kept), so every window
runs the encoder over 1500 positions, however short the sound: one second becomes one window,
``1500 // stack_factor`` embeddings, 30 with the defaults (see `audio_tokens`); from about 30 s
on, two windows and more, each its own audio chunk from ``mtmd_tokenize``. The output size
(``clip.audio.projection_dim`` and ``mm.a.mlp.2``'s rows) must equal the text model's
``n_embd`` (``build_llama_gguf``'s, 64 by default), or ``mtmd_init_from_file`` refuses the
pair. Used by the test fixtures next to ``tiny_model.build_llama_gguf``.
"""

from __future__ import annotations

import math
import random
import struct
import wave
from pathlib import Path

from tiny_mmproj import MmprojFile

SAMPLE_RATE = 16000  # libmtmd's Whisper preprocessing: 16 kHz, 25 ms windows, 10 ms hops
HOP = 160
WINDOW_FRAMES = 3000  # mel frames in one 30 s window (the encoder's input)
N_POS = WINDOW_FRAMES // 2  # positions after the stride-2 conv


def audio_tokens(seconds: float = 1.0, stack_factor: int = 50) -> int:
    """How many embeddings (text positions) `seconds` of audio become with
    `build_audio_mmproj_gguf`'s file: ``1500 // stack_factor`` per 30 s window."""
    n_samples = round(seconds * SAMPLE_RATE)
    # The samples plus 30 s of silence (and 200 reflected at each end), in 400-sample frames
    # every 160; whole 3000-frame windows only.
    n_frames = (n_samples + 30 * SAMPLE_RATE) // HOP + 1
    return (n_frames // WINDOW_FRAMES) * (N_POS // stack_factor)


def build_audio_mmproj_gguf(
    out: Path,
    *,
    n_embd_text: int = 64,
    n_mel_bins: int = 16,
    n_embd: int = 32,
    n_layer: int = 1,
    n_head: int = 2,
    n_ff: int = 64,
    stack_factor: int = 50,
    n_hidden: int = 64,
    seed: int = 0,
) -> Path:
    """Write a random-weight Ultravox-style ("ultravox") audio projector to `out`, its output
    embeddings `n_embd_text` wide (the text model's ``n_embd``)."""
    if n_embd % n_head:
        raise ValueError(f"n_embd {n_embd} is not a multiple of n_head {n_head}")
    if N_POS % stack_factor:
        # clip.cpp counts ceil(3000 / stack_factor) // 2 tokens while the graph makes
        # ceil(1500 / stack_factor); they agree only when stack_factor divides 1500.
        raise ValueError(f"stack_factor {stack_factor} does not divide {N_POS}")
    if not 1 <= n_mel_bins <= 256:
        raise ValueError(f"n_mel_bins {n_mel_bins} is not in [1, 256]")
    if n_ff == n_embd:
        # clip.cpp takes an ffn_down whose first dimension is n_embd for an old, swapped export.
        raise ValueError("n_ff must differ from n_embd")
    n_stacked = n_embd * stack_factor

    f = MmprojFile(out, "tiny-ultravox-mmproj", seed)
    writer, tensor = f.writer, f.tensor
    writer.add_clip_has_audio_encoder(True)
    writer.add_clip_projector_type("ultravox")
    writer.add_audio_num_mel_bins(n_mel_bins)
    writer.add_audio_embedding_length(n_embd)
    writer.add_audio_feed_forward_length(n_ff)
    writer.add_audio_block_count(n_layer)
    writer.add_audio_head_count(n_head)
    writer.add_audio_attention_layernorm_eps(1e-5)
    writer.add_audio_projection_dim(n_embd_text)
    writer.add_audio_stack_factor(stack_factor)
    # (libmtmd fixes the rest for Whisper types: 16 kHz, n_fft 400, hop 160, GELU (erf).)

    # numpy shapes are GGUF's (ne0, ne1, ...) reversed; a Linear's weight is (out, in), a
    # Conv1d's (out channels, in channels, kernel), its bias (out channels, 1) as the converter
    # writes it, to broadcast over the frames.
    tensor("a.conv1d.1.weight", (n_embd, n_mel_bins, 3), scale=0.2)
    tensor("a.conv1d.1.bias", (n_embd, 1))
    tensor("a.conv1d.2.weight", (n_embd, n_embd, 3), scale=0.2)  # stride 2
    tensor("a.conv1d.2.bias", (n_embd, 1))
    tensor("a.position_embd.weight", (N_POS, n_embd))
    f.blocks("a.blk", n_layer, n_embd, n_ff, k_bias=False)  # (Whisper's key has no bias: asserted)
    tensor("a.post_ln.weight", (n_embd,), fill=1.0)
    tensor("a.post_ln.bias", (n_embd,), fill=0.0)
    # The projector: RMSNorm (norm_pre), mlp.1 (stacked -> 2 * hidden), SwiGLU, RMSNorm
    # (norm_mid), mlp.2 (hidden -> text width); no biases.
    tensor("mm.a.norm_pre.weight", (n_stacked,), fill=1.0)
    tensor("mm.a.mlp.1.weight", (2 * n_hidden, n_stacked), scale=0.05)
    tensor("mm.a.norm_mid.weight", (n_hidden,), fill=1.0)
    tensor("mm.a.mlp.2.weight", (n_embd_text, n_hidden), scale=0.2)
    return f.write()


def write_wav(path: Path, seconds: float = 1.0, rate: int = 16000, seed: int = 0) -> Path:
    """Write a mono 16-bit PCM WAV of `seconds` of a 440 Hz tone with a little noise (standard
    library only) to `path` (via a temporary name) and return it."""
    rng = random.Random(seed)
    n = round(seconds * rate)
    frames = struct.pack(
        f"<{n}h",
        *(int(8000 * math.sin(2 * math.pi * 440 * i / rate) + rng.uniform(-1000, 1000))
          for i in range(n)))
    tmp = path.with_name(path.name + ".tmp")
    with wave.open(str(tmp), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(frames)
    tmp.replace(path)
    return path
