"""models.toml: the shipped catalog is valid; a user's file overlays it; mistakes name the line."""

from __future__ import annotations

import pytest
from conftest import assert_one_line_error, run_cli

from infer.quant.catalog import SHIPPED, load_catalog
from infer.quant.hub_reference import parse_hub_reference
from infer.quant.quants import PREFERENCE, choose, group_by_quant, quant_of
from infer.runtime.errors import UsageError
from infer.runtime.sampling import SamplingParams


def test_shipped_catalog_is_valid_and_broad(tmp_path):
    catalog = load_catalog(tmp_path / "none.toml")
    assert len(catalog) >= 15
    families = {alias.split(":")[0].rstrip("0123456789.-") for alias in catalog}
    assert {"qwen", "llama", "gemma", "phi", "mistral", "smollm"} <= families
    for entry in catalog.values():
        assert entry.quant.upper() in PREFERENCE
        SamplingParams.resolve(entry.sampling, {})  # every recommended value is in range
    assert SHIPPED.name == "models.toml"


def test_user_file_adds_and_overrides_entries(tmp_path):
    user = tmp_path / "models.toml"
    user.write_text('[models."mine:1b"]\nrepo = "me/mine-GGUF"\nquant = "Q8_0"\nsource = "me/mine"\n'
                    '[models."qwen2.5:1.5b"]\nquant = "Q8_0"\n')
    catalog = load_catalog(user)
    assert catalog["mine:1b"].repo == "me/mine-GGUF"
    assert catalog["qwen2.5:1.5b"].quant == "Q8_0"
    assert catalog["qwen2.5:1.5b"].repo == "Qwen/Qwen2.5-1.5B-Instruct-GGUF"  # kept


def test_an_entry_may_name_its_projector_pooling_and_prefixes(tmp_path):
    """The keys models.toml's header documents: mmproj, and an embedding model's pooling (where
    its GGUF records none), document prefix and query prefix."""
    user = tmp_path / "models.toml"
    user.write_text('[models."vis"]\nrepo = "me/vis-GGUF"\nquant = "Q8_0"\nsource = "me/vis"\n'
                    'mmproj = "mmproj-vis-F16.gguf"\n'
                    '[models."emb"]\nrepo = "me/emb-GGUF"\nquant = "Q8_0"\nsource = "me/emb"\n'
                    'pooling = "last"\nprefix = "passage: "\nquery_prefix = "query: "\n')
    catalog = load_catalog(user)
    assert catalog["vis"].mmproj == "mmproj-vis-F16.gguf" and catalog["vis"].pooling is None
    emb = catalog["emb"]
    assert (emb.pooling, emb.prefix, emb.query_prefix) == ("last", "passage: ", "query: ")
    shipped = load_catalog(tmp_path / "none.toml")
    assert shipped["nomic-embed-text"].query_prefix == "search_query: "
    assert shipped["bge-reranker-v2-m3"].pooling == "rank"


@pytest.mark.parametrize("text, line, fragment", [
    ('[models."a:1"]\nrepo = "x/y"\nquant = "Q4_K_M"\nsource = "x/z"\n\n[models."b"]\nrepo = 3\n',
     6, "repo must be a str"),
    ('[models."a:1"]\nrepo = "x/y"\nquant = "Q4_K_M"\nsource = "x/z"\nsampling = { heat = 2 }\n',
     1, "unknown sampling key 'heat'"),
    ('# comment\n[models."a"]\nrepo = "not-a-repo"\n', 2, "owner/name"),
    ('[models."a"\nrepo = "x/y"\n', 1, "invalid TOML"),
    ('\n\n[models."Bad/Alias"]\nrepo = "x/y"\n', 3, "aliases"),
    ('[models."e"]\nrepo = "x/y"\nquant = "Q8_0"\nsource = "x/z"\npooling = "max"\n', 1,
     "pooling must be one of mean, cls, last, rank"),
])
def test_bad_user_file_names_file_and_line(tmp_path, text, line, fragment):
    user = tmp_path / "models.toml"
    user.write_text(text)
    with pytest.raises(UsageError) as err:
        load_catalog(user)
    message = str(err.value)
    assert fragment in message
    if "invalid TOML" not in message:
        assert message.startswith(f"{user}:{line}:")
    else:
        assert "line 1" in message


def test_cli_reports_a_bad_user_catalog_with_exit_2(infer_home):
    infer_home.mkdir(parents=True, exist_ok=True)
    (infer_home / "models.toml").write_text('[models."x:1"]\nrepo = "a/b"\nquant = 4\n')
    assert_one_line_error(run_cli("run", "x:1", "hi"), 2, "models.toml:1:", "quant must be a str")


@pytest.mark.parametrize("reference, repo, quant", [
    ("owner/repo", "owner/repo", None),
    ("owner/repo:Q5_K_M", "owner/repo", "Q5_K_M"),
    ("hf.co/bartowski/Llama-3.2-3B-Instruct-GGUF:q8_0", "bartowski/Llama-3.2-3B-Instruct-GGUF", "q8_0"),
    ("https://huggingface.co/a/b", "a/b", None),
])
def test_hub_references(reference, repo, quant):
    ref = parse_hub_reference(reference)
    assert ref is not None and (ref.repo, ref.quant) == (repo, quant)


@pytest.mark.parametrize("name", ["qwen2.5:1.5b", "./file.gguf", "just-a-name"])
def test_non_hub_references(name):
    assert parse_hub_reference(name) is None


@pytest.mark.parametrize("filename, quant", [
    ("Llama-3.2-3B-Instruct-Q5_K_M.gguf", "Q5_K_M"),
    ("qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf", "Q4_K_M"),
    ("Q4_K_M/model-Q4_K_M-00002-of-00003.gguf", "Q4_K_M"),
    ("gemma-3-4b-it-BF16.gguf", "BF16"),
    ("qwen2.5-0.5b-instruct-fp16.gguf", "F16"),
    ("x-IQ4_XS.gguf", "IQ4_XS"),
    ("model-UD-Q4_K_XL.gguf", "UD-Q4_K_XL"),
    ("README.md", None),
])
def test_quant_in_file_names(filename, quant):
    assert quant_of(filename) == quant


def test_quant_choice_prefers_q4_k_m_and_takes_all_split_parts():
    files = ["m-Q8_0.gguf", "m-Q4_K_M-00002-of-00002.gguf", "m-Q4_K_M-00001-of-00002.gguf",
             "mmproj-m-F16.gguf", "README.md"]
    groups = group_by_quant(files)
    assert set(groups) == {"Q8_0", "Q4_K_M"}  # the vision projector is not a model
    assert choose(groups, None, repo="r").files == ("m-Q4_K_M-00001-of-00002.gguf",
                                                    "m-Q4_K_M-00002-of-00002.gguf")
    assert choose(groups, "q8_0", repo="r").files == ("m-Q8_0.gguf",)
    assert choose(group_by_quant(["a-Q6_K.gguf", "a-Q3_K_M.gguf"]), None, repo="r").quant == "Q6_K"


def test_unknown_quant_lists_what_the_repo_has():
    with pytest.raises(UsageError, match="o/r has no Q2_K file; it has Q4_K_M, Q8_0"):
        choose(group_by_quant(["a-Q8_0.gguf", "a-Q4_K_M.gguf"]), "Q2_K", repo="o/r")
