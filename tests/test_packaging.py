"""The wheel installs on its own and the `infer` command works from anywhere."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_wheel_installs_and_runs_outside_the_repo(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist),
                    str(REPO)], check=True, capture_output=True, timeout=600)
    wheel = next(dist.glob("infer-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top_level == {"infer"}  # no generic top-level names such as `cli` or `runtime`
    assert {"infer/cli/main.py", "infer/runtime/session.py", "infer/quant/gguf_check.py",
            "infer/models.toml", "infer/cli/plain_args.json"} <= set(names)

    # A fresh environment with infer's wheel alone, next to the installed dependencies.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(site, "deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    # --ignore-installed: the dependencies' folder may hold an installed infer already.
    subprocess.run([py, "-m", "pip", "install", "--no-deps", "--ignore-installed", "-q", str(wheel)],
                   check=True,
                   capture_output=True, timeout=300)

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    infer = venv / "bin" / "infer"
    help_ = subprocess.run([infer, "--help"], cwd=outside, capture_output=True, text=True, timeout=60)
    assert help_.returncode == 0, help_.stderr
    assert "run" in help_.stdout and "bench" in help_.stdout
    version = subprocess.run([infer, "--version"], cwd=outside, capture_output=True, text=True,
                             timeout=60)
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("infer 0.")
    assert "llama.cpp" in version.stdout
    # A plain `infer run` reads the shipped plain_args.json (cli/plain_args.py): a missing
    # model is exit 3, as through Typer.
    missing = subprocess.run([infer, "run", str(outside / "missing.gguf"), "hi"], cwd=outside,
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 3 and "missing.gguf" in missing.stderr, missing.stderr
    where = subprocess.run([py, "-c", "import infer.cli; print(infer.cli.__file__)"], cwd=outside,
                           capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(venv))
    # The shipped models.toml is found by the installed package.
    aliases = subprocess.run([py, "-c", "from infer.quant.catalog import load_catalog; "
                              "print(len(load_catalog()))"], cwd=outside, capture_output=True,
                             text=True, check=True).stdout
    assert int(aliases) >= 15
