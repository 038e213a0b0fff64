"""The memory planner behind -ngl auto and --explain: its arithmetic on made-up devices,
checked against hand-computed cases, and against what llama.cpp really allocates."""

from __future__ import annotations

import json
import re

import pytest
from conftest import assert_one_line_error, run_cli

from infer.runtime.memory_plan import (
    Budget,
    ContextShape,
    ModelLayout,
    compute_bytes,
    layer_devices,
    plan_memory,
)

MiB = 1 << 20

# 4 layers of 100 MiB, 50 MiB of embeddings, a 60 MiB output layer; 2 KV heads of 128:
# the f16 KV cache takes 2 heads x 128 x 2 bytes x (K + V) = 1,024 bytes per token and layer.
LAYOUT = ModelLayout(n_layer=4, layer_bytes=(100 * MiB,) * 4, input_bytes=50 * MiB,
                     output_bytes=60 * MiB, n_embd=1024, n_head=8, n_head_kv=(2,) * 4,
                     head_dim_k=128, head_dim_v=128, n_vocab=32000, n_ctx_train=8192)
SHAPE = ContextShape(n_ctx=4096)  # 4 MiB of KV cache per layer
LAYER = 100 * MiB + 4 * MiB
COMPUTE = compute_bytes(LAYOUT, SHAPE)
HOST = Budget("CPU", "test CPU", 64 << 30)


def test_compute_estimate_is_the_larger_stage_plus_a_tenth():
    # logits: 512 x (32000 + 2 x 1024) floats;
    # attention: 512 x (4096 x (8 heads + the mask) + 10 x 1024) floats
    assert int(4 * 512 * (4096 * 9 + 10 * 1024) * 1.1) == COMPUTE
    small = ContextShape(n_ctx=512)
    assert compute_bytes(LAYOUT, small) == int(4 * 512 * (32000 + 2048) * 1.1)
    assert compute_bytes(LAYOUT, ContextShape(n_ctx=4096, flash_attn=True)) == int(4 * 512 * 34048 * 1.1)


def test_auto_offloads_the_output_layer_first_then_the_last_layers():
    gpu = Budget("GPU0", "test GPU", COMPUTE + 60 * MiB + 2 * LAYER)  # room for output + 2 layers
    plan = plan_memory(LAYOUT, SHAPE, host=HOST, devices=[gpu])
    assert plan.n_gpu_layers == 3
    cpu, dev = plan.placements
    assert dev.layers == (2, 3, 4)  # 4 = the output layer
    assert dev.weights == 260 * MiB and dev.kv == 8 * MiB and dev.compute == COMPUTE
    assert cpu.layers == (0, 1) and cpu.weights == 250 * MiB and cpu.kv == 8 * MiB
    assert plan.fits
    one_byte_short = Budget("GPU0", "test GPU", gpu.free - 1)
    assert plan_memory(LAYOUT, SHAPE, host=HOST, devices=[one_byte_short]).n_gpu_layers == 2


def test_auto_shares_layers_by_free_memory_like_llama_cpp():
    small = Budget("RPC0", "10.0.0.2:50052", 1 << 30)
    large = Budget("GPU0", "test GPU", 3 << 30)
    plan = plan_memory(LAYOUT, SHAPE, host=HOST, devices=[small, large])
    assert plan.n_gpu_layers == 5 and plan.tensor_split == (1.0, 3.0)  # GiB free
    # cumulative shares 0.25, 1.0: layer il goes to the first share above il / 5
    assert [p.layers for p in plan.placements] == [(), (0, 1), (2, 3, 4)]
    assert plan.placements[0].weights == 50 * MiB  # the input layer never leaves the CPU


def test_auto_fills_devices_in_order_when_shares_by_memory_do_not_fit():
    first = Budget("RPC0", "10.0.0.2:50052", COMPUTE + 2 * LAYER)  # exactly layers 0 and 1
    second = Budget("GPU0", "test GPU", COMPUTE + 2 * LAYER + 60 * MiB)  # exactly 2, 3 and output
    plan = plan_memory(LAYOUT, SHAPE, host=HOST, devices=[first, second])
    assert plan.n_gpu_layers == 5 and plan.tensor_split == (2.0, 3.0)
    assert [p.layers for p in plan.placements] == [(), (0, 1), (2, 3, 4)]
    assert all(p.fits for p in plan.placements)


def test_nothing_fits_on_a_tiny_device_and_nothing_is_offloaded():
    plan = plan_memory(LAYOUT, SHAPE, host=HOST, devices=[Budget("GPU0", "", COMPUTE)])
    assert plan.n_gpu_layers == 0 and plan.tensor_split == ()
    assert plan.placements[1].compute == 0  # a device that holds nothing needs no buffer


def test_explicit_layers_are_split_like_llama_cpp():
    # llama.cpp: start = n_layer + 1 - ngl; layer il goes to the first device whose
    # cumulative share exceeds (il - start) / ngl.
    assert layer_devices(4, 3, (1.0, 1.0)) == [-1, -1, 0, 0, 1]
    assert layer_devices(4, 5, (2.0, 3.0)) == [0, 0, 1, 1, 1]
    assert layer_devices(4, 99, (1.0,)) == [0] * 5
    assert layer_devices(4, 0, (1.0,)) == [-1] * 5
    plan = plan_memory(LAYOUT, SHAPE, host=HOST, devices=[Budget("A", "", 1 << 40), Budget("B", "", 1 << 40)],
                       n_gpu_layers=3, tensor_split=(1, 1))
    assert [p.layers for p in plan.placements] == [(0, 1), (2, 3), (4,)]
    all_layers = plan_memory(LAYOUT, SHAPE, host=HOST, devices=[Budget("A", "", 1 << 40)], n_gpu_layers=-1)
    assert all_layers.n_gpu_layers == 5


def test_tensor_split_must_name_every_device():
    from infer.runtime.errors import UsageError

    with pytest.raises(UsageError, match="2 weights for 1 device"):
        plan_memory(LAYOUT, SHAPE, host=HOST, devices=[Budget("A", "", 1 << 40)], tensor_split=(1, 1))


def test_largest_context_that_fits_on_the_cpu():
    weights = (50 + 400 + 60) * MiB

    def need(n_ctx: int) -> int:  # everything on the CPU
        return weights + n_ctx * 4 * 1024 + compute_bytes(LAYOUT, ContextShape(n_ctx=n_ctx))

    host = Budget("CPU", "", need(6000))
    plan = plan_memory(LAYOUT, ContextShape(n_ctx=8192), host=host)
    assert not plan.fits
    assert plan.max_ctx == 5888  # the largest multiple of 256 under 6,000
    assert plan_memory(LAYOUT, ContextShape(n_ctx=5888), host=host).fits
    assert not plan_memory(LAYOUT, ContextShape(n_ctx=5888 + 256), host=host).fits
    assert plan_memory(LAYOUT, ContextShape(n_ctx=4096), host=Budget("CPU", "", weights)).max_ctx == 0


def kv_bytes(plan) -> int:
    """The KV cache of every device of the plan."""
    return sum(p.kv for p in plan.placements)


def test_quantized_kv_cache_is_smaller():
    q8 = plan_memory(LAYOUT, ContextShape(n_ctx=4096, type_k="q8_0", type_v="q8_0"), host=HOST)
    # q8_0: 34 bytes per 32 values instead of 64
    assert kv_bytes(q8) == 4 * 4096 * 2 * (256 // 32 * 34)


def test_layout_from_a_real_header(tiny_llama):
    from infer.quant.gguf_check import check_gguf

    info = check_gguf(tiny_llama)
    layout = ModelLayout.from_gguf(info.metadata, ((t.name, t.shape, t.nbytes) for t in info.tensors))
    assert layout.n_layer == 2 and layout.n_vocab > 100_000
    assert layout.input_bytes + sum(layout.layer_bytes) + layout.output_bytes == sum(
        t.nbytes for t in info.tensors)


def _sizes(stderr: str, what: str) -> float:
    found = re.findall(rf"CPU {what} buffer size =\s+([\d.]+) MiB", stderr)
    assert found, stderr[-2000:]
    return float(found[-1])


@pytest.mark.parametrize("n_ctx", [4096, 16384])
def test_plan_matches_what_llama_cpp_allocates(tiny_spm, n_ctx):
    """The KV cache figure is exact; the compute estimate covers llama.cpp's buffer
    without asking for much more."""
    explained = run_cli("run", tiny_spm, "-c", n_ctx, "--explain")
    assert explained.returncode == 0, explained.stderr
    r = run_cli("run", tiny_spm, "-c", n_ctx, "-n", "1", "-v", "--no-cache", "hi")
    assert r.returncode == 0, r.stderr
    kv, compute = _sizes(r.stderr, "KV"), _sizes(r.stderr, "compute")
    from infer.quant.layout import model_layout

    layout = model_layout(tiny_spm)
    shape = ContextShape(n_ctx=n_ctx)
    plan = plan_memory(layout, shape, host=HOST)
    assert kv_bytes(plan) / MiB == pytest.approx(kv, rel=0.01)
    assert compute <= compute_bytes(layout, shape) / MiB <= compute * 1.5 + 1
    assert "placement: CPU: layers 0-1, output" in r.stderr


def test_explain_prints_the_plan_and_loads_nothing(tiny_spm):
    r = run_cli("run", tiny_spm, "--explain", "-c", "1024")
    assert r.returncode == 0, r.stderr
    assert "memory plan for a context of 1024 tokens" in r.stdout
    assert re.search(r"CPU .*input, 0-1, output", r.stdout), r.stdout
    assert "largest context that fits" in r.stdout
    assert "llama" not in r.stderr  # nothing was loaded: llama.cpp said nothing
    for command in ("chat", "bench", "batch"):
        other = run_cli(command, tiny_spm, "--explain", "-c", "1024")
        assert other.returncode == 0 and "memory plan" in other.stdout, (command, other.stderr)


def test_a_context_that_cannot_fit_fails_before_allocating(tiny_spm):
    r = run_cli("run", tiny_spm, "-c", 400_000_000, "hi", timeout=60)
    assert_one_line_error(r, 5, "does not fit in memory", "the largest context that fits is")
    largest = int(re.search(r"-c (\d+)\)", r.stderr).group(1))
    assert largest % 256 == 0 and largest > 4096
    # The host's free memory moves between two processes (other work on the machine), so the
    # second run asks for a little less than the largest context the first one reported.
    fits = largest * 9 // 10 // 256 * 256
    ok = run_cli("run", tiny_spm, "--explain", "-c", fits)
    assert ok.returncode == 0 and "does not fit" not in ok.stdout, ok.stderr
    assert f"{fits:,}" in ok.stdout or str(fits) in ok.stdout


def test_bad_offload_flags_are_usage_errors(tiny_spm):
    assert_one_line_error(run_cli("run", tiny_spm, "-ngl", "many", "hi"), 2, "-ngl")
    assert_one_line_error(run_cli("run", tiny_spm, "-ts", "3,x", "hi"), 2, "--tensor-split")
    assert_one_line_error(run_cli("run", tiny_spm, "--rpc", "nohostport", "hi"), 2, "HOST:PORT")
    # no GPU and no worker here: a split over no device is refused, not ignored
    assert_one_line_error(run_cli("run", tiny_spm, "-ts", "1,1", "hi"), 2, "--tensor-split")


def test_layout_is_remembered_between_runs(tiny_spm, infer_home):
    assert run_cli("run", tiny_spm, "--explain").returncode == 0
    memo = json.loads((infer_home / "layouts.json").read_text())
    (entry,) = memo.values()
    assert entry["layout"]["n_layer"] == 2


def test_ctx_size_0_is_the_models_training_context_as_in_llama_cpp(smollm2):
    """SmolLM2 was trained on 8192 tokens: the default takes at most 4096, -c 0 all of them
    (run and batch alike); a context under 16 tokens is refused, saying what 0 means."""
    def planned(*args: str) -> str:
        r = run_cli(*args, "--explain")
        assert r.returncode == 0, r.stderr
        return r.stdout.splitlines()[0]

    assert "a context of 4096 tokens" in planned("run", str(smollm2))
    assert "a context of 8192 tokens" in planned("run", str(smollm2), "-c", "0")
    assert "a context of 8192 tokens" in planned("batch", str(smollm2), "-c", "0")
    assert_one_line_error(run_cli("run", smollm2, "-c", "5", "hi"), 2, "at least 16 tokens", "0:")
