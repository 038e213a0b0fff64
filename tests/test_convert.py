"""Converted checkpoints compute what the original computes: llama.cpp's logits vs transformers'."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from tiny_model import tokenizer_dir

from infer.quant.convert import convert
from infer.runtime.evaluate import all_logits
from infer.runtime.params import ContextParams
from infer.runtime.session import Session

TEXT = ("The quick brown fox jumps over the lazy dog. 123 + 456 = 579; "
        "def f(x):\n    return x ** 2  # ünïcödé, 日本語, emoji 🙂")

_GEMMA = {"head_dim": 32, "query_pre_attn_scalar": 32, "sliding_window": 256,
          "hidden_activation": "gelu_pytorch_tanh"}
# (architecture config class, fixture tokenizer, extra config)
CASES = {
    "LlamaForCausalLM": (transformers.LlamaConfig, "llama3", {"tie_word_embeddings": False}),
    "MistralForCausalLM": (transformers.MistralConfig, "spm-32k", {"sliding_window": None}),
    "Qwen2ForCausalLM": (transformers.Qwen2Config, "qwen3", {"vocab_size": 151936}),
    "Qwen3ForCausalLM": (transformers.Qwen3Config, "qwen3", {"tie_word_embeddings": True,
                                                            "head_dim": 32}),
    "Gemma2ForCausalLM": (transformers.Gemma2Config, "spm-32k", {
        **_GEMMA, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}),
    "Gemma3ForCausalLM": (transformers.Gemma3TextConfig, "spm-32k", _GEMMA),
    # Google's own Gemma 3 tokenizer (262,144 tokens; Gemma 2's is built the same way)
    "Gemma3ForCausalLM:gemma3-tokenizer": (transformers.Gemma3TextConfig, "gemma3", _GEMMA),
    "Gemma2ForCausalLM:gemma3-tokenizer": (transformers.Gemma2Config, "gemma3", {
        **_GEMMA, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}),
    "Phi3ForCausalLM": (transformers.Phi3Config, "spm-32k", {"pad_token_id": 0}),
    # Variants (CASE:variant) for RoPE scaling that llama.cpp needs extra tensors for.
    "LlamaForCausalLM:llama3-rope": (transformers.LlamaConfig, "llama3", {"rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    "Phi3ForCausalLM:longrope": (transformers.Phi3Config, "spm-32k", {
        "pad_token_id": 0, "max_position_embeddings": 8192, "original_max_position_embeddings": 4096,
        "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                            "short_factor": [1.0 + i / 16 for i in range(8)],
                            "long_factor": [2.0 + i / 8 for i in range(8)]}}),
}
# llama.cpp's CPU GELU reads an F16 table (Gemma's MLP): against plain transformers that
# alone makes ~1e-3 of error (1.1e-3 with Gemma 3's 262k vocabulary; llama.cpp's own
# converter gives bit-identical logits). With the same table in transformers what is left
# is 1e-4 to 3e-4, so Gemma is checked against that, and argmax against plain transformers.
# What is left moves with the CPU: an x that the two sum in another order can fall on the
# other side of an F16 rounding boundary and take the next table entry (Gemma 3 on its own
# tokenizer: 2.7e-4 on an AMD EPYC (AVX2), under 2.5e-4 where the tolerance was first set).
# A wrong norm or scaling convention is off by 1e-2 and more.
TOLERANCE = {"Gemma2ForCausalLM": 5e-4, "Gemma3ForCausalLM": 5e-4}
F16_GELU = ("Gemma2ForCausalLM", "Gemma3ForCausalLM")


def build_checkpoint(folder: Path, case: str, dtype: torch.dtype = torch.float32) -> Path:
    """A tiny random checkpoint for `case` (an architecture) on a real tokenizer, as safetensors."""
    config_cls, tokenizer, extra = CASES[case]
    arch = case.split(":")[0]
    tok_dir = tokenizer_dir(tokenizer)
    from tokenizers import Tokenizer

    n_tokens = Tokenizer.from_file(str(tok_dir / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    config = config_cls(**{
        "vocab_size": n_tokens, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5, **extra})
    config.architectures = [arch]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:  # a wrong norm convention must show
                param.normal_(1.0, 0.2)
    model = model.to(dtype)
    model.save_pretrained(folder, safe_serialization=True)
    for f in tok_dir.iterdir():
        shutil.copy(f, folder / f.name)
    return folder


class F16TableGelu(torch.nn.Module):
    """GELU (tanh form) as llama.cpp's CPU backend computes it: looked up by the F16 of x in
    a table of F16 values; x itself above 10, 0 below -10."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.gelu(x.half().float(), approximate="tanh").half().float()
        return torch.where(x <= -10, torch.zeros_like(x), torch.where(x >= 10, x, y))


def hf_logits(folder: Path, ids: list[int]) -> np.ndarray:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def hf_logits_both(folder: Path, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """transformers' logits with llama.cpp's F16 GELU table, and plain (one model load)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    with torch.no_grad():
        plain = model(torch.tensor([ids])).logits[0].numpy()
        for layer in model.model.layers:
            layer.mlp.act_fn = F16TableGelu()
        return model(torch.tensor([ids])).logits[0].numpy(), plain


def gguf_logits(path: Path, ids: list[int]) -> np.ndarray:
    # F32 KV cache and no flash attention: either alone rounds through F16.
    params = ContextParams(n_ctx=512, cache_type_k="f32", cache_type_v="f32", flash_attn="off")
    with Session.open(path, params) as session:
        return all_logits(session, ids)


def token_ids(folder: Path) -> list[int]:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(folder / "tokenizer.json")).encode(TEXT).ids


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory):
    """`converted(case)`: the case's checkpoint folder and its F32 GGUF, built once for the module
    (a 262k-token vocabulary takes seconds to build and convert)."""
    built: dict[str, tuple[Path, Path]] = {}

    def get(case: str) -> tuple[Path, Path]:
        if case not in built:
            root = tmp_path_factory.mktemp("converted")
            folder = build_checkpoint(root / "hf", case)
            built[case] = folder, convert(folder, root / "model-f32.gguf", out_type="F32")
        return built[case]
    return get


@pytest.mark.parametrize("case", list(CASES))
def test_converted_model_matches_transformers(case, converted):
    arch = case.split(":")[0]
    folder, out = converted(case)
    ids = token_ids(folder)
    ours = gguf_logits(out, ids)
    if arch in F16_GELU:
        theirs, plain = hf_logits_both(folder, ids)
    else:
        theirs = plain = hf_logits(folder, ids)
    assert ours.shape == theirs.shape
    rel = np.abs(ours - theirs).max() / np.abs(theirs).max()
    assert rel <= TOLERANCE.get(arch, 1e-5), rel
    assert (ours.argmax(-1) == plain.argmax(-1)).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["F16", "BF16"])
def test_half_precision_sources_convert_exactly(dtype, tmp_path):
    folder = build_checkpoint(tmp_path / "hf", "LlamaForCausalLM", dtype)
    out = convert(folder, tmp_path / "model.gguf", out_type="F32")
    ids = token_ids(folder)
    ours, theirs = gguf_logits(out, ids), hf_logits(folder, ids)
    rel = np.abs(ours - theirs).max() / np.abs(theirs).max()
    assert rel <= 1e-5, rel


def test_quantize_a_checkpoint_folder_and_run_it_by_name(tmp_path, infer_home):
    from conftest import run_cli

    folder = build_checkpoint(tmp_path / "my-tiny-qwen", "Qwen3ForCausalLM")
    (folder / "README.md").write_text("---\nlicense: apache-2.0\nlibrary_name: transformers\n---\n# Tiny\n")
    r = run_cli("quantize", folder, "--type", "Q4_K_M")
    assert r.returncode == 0, r.stderr
    out = infer_home / "models" / "my-tiny-qwen-10M-Q4_K_M.gguf"
    assert r.stdout.strip() == str(out)
    ran = run_cli("run", out.stem, "Hello", "-n", "4", "--seed", "1", "--json")
    assert ran.returncode == 0, ran.stderr
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temporary left
    import json

    shown = json.loads(run_cli("show", out.stem, "--json").stdout)
    assert shown["license"] == "apache-2.0" and shown["architecture"] == "qwen3"


@pytest.mark.parametrize("make, fragment", [
    (lambda d: (d / "config.json").write_text("{not json"), "malformed config.json"),
    (lambda d: (d / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}'),
     "no .safetensors weights"),
    (lambda d: ((d / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}'),
                (d / "pytorch_model.bin").write_bytes(b"\x80\x04")), "never unpickles"),
    (lambda d: (d / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}'),
     "cannot convert architecture 'GPT2LMHeadModel'"),
    (lambda d: None, "no config.json"),
])
def test_bad_checkpoint_folders_are_model_errors(tmp_path, infer_home, make, fragment):
    from conftest import assert_one_line_error, run_cli

    folder = tmp_path / "hf"
    folder.mkdir()
    make(folder)
    assert_one_line_error(run_cli("quantize", folder, "--type", "Q8_0"), 3, fragment)
    assert not (infer_home / "models").exists() or list((infer_home / "models").iterdir()) == []


def test_missing_tensor_is_named(tmp_path):
    from safetensors.numpy import load_file, save_file

    from infer.runtime.errors import ModelError

    folder = build_checkpoint(tmp_path / "hf", "LlamaForCausalLM")
    weights = load_file(folder / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, folder / "model.safetensors")
    with pytest.raises(ModelError, match=r"lacks blk\.1\.ffn_up\.weight"):
        convert(folder, tmp_path / "out.gguf", out_type="F32")
    assert not (tmp_path / "out.gguf").exists()


def test_quality_check_orders_quants(tmp_path, infer_home):
    import json

    from conftest import run_cli

    folder = build_checkpoint(tmp_path / "q", "LlamaForCausalLM")
    reports = {}
    for quant in ("Q8_0", "Q4_K_M"):
        r = run_cli("quantize", folder, "--type", quant, "--json")
        assert r.returncode == 0, r.stderr
        reports[quant] = json.loads(r.stdout)["quality"]
        assert np.isfinite(reports[quant]["mean_kl_divergence"])
        assert 0 <= reports[quant]["top1_agreement"] <= 1
        if quant == "Q4_K_M":  # (the file runs by its name)
            ran = run_cli("run", Path(json.loads(r.stdout)["path"]).stem, "Hi", "-n", "3")
            assert ran.returncode == 0, ran.stderr
    assert reports["Q8_0"]["mean_kl_divergence"] < reports["Q4_K_M"]["mean_kl_divergence"]
    assert reports["Q8_0"]["bits_per_weight"] > reports["Q4_K_M"]["bits_per_weight"]
    # (without --json the same figures are a table on stderr: tests/test_quantize.py)


def test_run_converts_a_checkpoint_folder_once(tmp_path, infer_home):
    from conftest import run_cli

    folder = build_checkpoint(tmp_path / "fresh", "Qwen2ForCausalLM")
    first = run_cli("run", folder, "Hello", "-n", "4", "--seed", "2")
    assert first.returncode == 0, first.stderr
    assert "converting" in first.stderr and "Q4_K_M" in first.stderr
    second = run_cli("run", folder, "Hello", "-n", "4", "--seed", "2")
    assert second.stdout == first.stdout
    assert "converting" not in second.stderr
    assert len(list((infer_home / "models").glob("*.gguf"))) == 1


def test_dry_run_plans_without_writing(tmp_path, infer_home):
    import json

    from conftest import run_cli

    folder = build_checkpoint(tmp_path / "plan", "MistralForCausalLM")
    r = run_cli("quantize", folder, "--type", "Q8_0", "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)
    assert p["architecture"] == "MistralForCausalLM"
    types = {t["name"]: t["type"] for t in p["tensors"]}
    assert types["blk.0.attn_q.weight"] == "Q8_0" and types["blk.0.attn_norm.weight"] == "F32"
    assert 0 < p["estimated_bytes"] < p["parameters"] * 4
    assert not (infer_home / "models").exists()


def test_interrupted_conversion_leaves_nothing(tmp_path, infer_home):
    folder = build_checkpoint(tmp_path / "hf", "LlamaForCausalLM")

    def interrupt(name, index, count):
        if index == 3:
            raise KeyboardInterrupt  # what Ctrl-C raises between two tensors

    with pytest.raises(KeyboardInterrupt):
        convert(folder, tmp_path / "out.gguf", out_type="F16", progress=interrupt)
    assert sorted(p.name for p in tmp_path.iterdir() if p != infer_home) == ["hf"]


def test_run_converts_a_hub_checkpoint_once(tmp_path, infer_home, monkeypatch):
    from conftest import run_cli
    from hub_server import HubServer

    folder = build_checkpoint(tmp_path / "hf", "Qwen3ForCausalLM")
    with HubServer() as hub:
        hub.add_repo("acme/Tiny-Qwen", {p.name: p.read_bytes() for p in folder.iterdir()},
                     lfs_min_size=1024)
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        first = run_cli("run", "acme/Tiny-Qwen", "Hello", "-n", "3", "--seed", "1")
        assert first.returncode == 0, first.stderr
        assert "converting acme/Tiny-Qwen" in first.stderr
        asked = len(hub.requests)
        second = run_cli("run", "acme/Tiny-Qwen", "Hello", "-n", "3", "--seed", "1")
        assert second.stdout == first.stdout
        assert "converting" not in second.stderr
        assert len(hub.requests) == asked  # converted once, then neither downloaded nor asked
    assert [p.name for p in (infer_home / "models").iterdir()] == ["Tiny-Qwen-10M-Q4_K_M.gguf"]


@pytest.mark.parametrize("case", [c for c in CASES if c.endswith(":gemma3-tokenizer")])
def test_converted_gemma_tokenizes_like_hugging_face(case, converted):
    from test_convert_tokenizer import GEMMA_STRINGS
    from tokenizers import Tokenizer

    from infer.runtime.llama import Model

    folder, out = converted(case)
    hf = Tokenizer.from_file(str(folder / "tokenizer.json"))
    with Model(out, vocab_only=True) as model:
        for text in [TEXT, *GEMMA_STRINGS]:
            assert model.tokenize(text, add_special=True, parse_special=True) == hf.encode(text).ids, text
