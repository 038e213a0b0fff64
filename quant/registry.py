"""Model references: from what the user typed to a checked local GGUF file.

Resolution order, first match wins:
1. a path to a ``.gguf`` file (or the first part of a split GGUF);
2. a path to a Hugging Face model folder (converted to Q4_K_M on first use, then cached);
3. an alias from ``models.toml`` (shipped, overlaid by the user's): the file of an
   installed package that embeds it (``infer.quant.embedded``) if there is one, else
   its Hub repository;
4. a Hub reference ``owner/repo`` or ``owner/repo:QUANT``, optionally prefixed
   with ``hf.co/`` (downloaded into the Hugging Face cache when missing).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infer.quant.gguf_check import check_gguf
from infer.quant.hub_reference import HubReference, parse_hub_reference
from infer.quant.paths import checked_gguf_memo, known_output
from infer.quant.quants import SPLIT_PART, quant_of
from infer.runtime.atomic import write_atomic
from infer.runtime.errors import ModelError, ModelNotFoundError, NetworkError

if TYPE_CHECKING:
    from infer.quant.catalog import CatalogEntry

_MEMO_MAX = 512


@dataclass(frozen=True)
class ResolvedModel:
    """A local GGUF file ready for the runtime, what the user called it, and its alias entry."""

    reference: str
    path: Path
    entry: CatalogEntry | None = None
    repo: str | None = None
    quant: str | None = None
    package: str | None = None  # the installed package whose file this is (embedded models)
    mmproj: Path | None = None  # its multimodal projector (images, audio), from its repository

    # What runtime/loading.py reads of a model it opens (a model source):
    @property
    def ctx_size(self) -> int | None:
        """The context its alias recommends (used unless -c is given)."""
        return self.entry.ctx_size if self.entry else None

    @property
    def sampling(self) -> dict[str, Any]:
        """The sampling its alias recommends (over the file's own recommendations)."""
        return dict(self.entry.sampling) if self.entry else {}

    @property
    def pooling(self) -> str | None:
        """An embedding model's pooling, as its alias says (used where its GGUF records none)."""
        return self.entry.pooling if self.entry else None

    def layout(self) -> Any:
        """Its layout (runtime.memory_plan.ModelLayout), from the header, remembered per file."""
        from infer.quant.layout import model_layout

        return model_layout(self.path)

    def record_use(self) -> None:
        """For `infer list`'s LAST USED: a model it lists (from the Hub or a package) ran now."""
        if self.repo is not None or self.package is not None:
            from infer.quant.store import record_use

            record_use(self.path)


def hub_reference_for(reference: str, entry: CatalogEntry | None = None) -> HubReference | None:
    """The Hub repository and quant an alias (`entry`) or a Hub reference names."""
    if entry is not None:
        return HubReference(entry.repo, entry.quant)
    return parse_hub_reference(reference)


def resolve_model(reference: str, *, offline: bool = False,
                  progress: Callable[[str, int, int], None] | None = None,
                  notice: Callable[[str], None] | None = None, mmproj: bool = True,
                  ask: bool = False) -> ResolvedModel:
    """Turn a model reference into a checked local GGUF file, or raise an InferError.

    `progress` reports downloads; `notice` gets one-line news such as a first-use conversion.
    A Hub model's repository's projector comes with it unless `mmproj` is False; `ask`: read
    the Hub's listing even for a cached model (infer pull), fetching what is missing.
    """
    path = Path(reference).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            from infer.quant.build import converted_folder

            return ResolvedModel(reference, converted_folder(path, notice=notice))
        raise ModelNotFoundError(f"{reference}: is a folder, not a GGUF model file")
    if path.is_file() or (reference.endswith(".gguf") and "/" in reference):
        return ResolvedModel(reference, _local_gguf(path, reference))
    built = known_output(reference)
    if built is not None:  # written by `infer quantize`, run by its name
        return ResolvedModel(reference, _local_gguf(built, reference))
    if reference.endswith(".gguf"):
        return ResolvedModel(reference, _local_gguf(path, reference))
    from infer.quant.catalog import load_catalog  # (not for a file: models.toml is not read)

    entry = load_catalog().get(reference)
    if entry is not None and entry.embedded is not None:
        from infer.quant.embedded import embedded_file

        local = embedded_file(entry.embedded)
        if local is not None:  # installed with its package: no Hub, no network
            verify_gguf(local)
            return ResolvedModel(reference, local, entry, quant=quant_of(local.name),
                                 package=entry.embedded.requirement)
    hub = hub_reference_for(reference, entry)
    if hub is None:
        raise ModelNotFoundError(
            f"{reference}: no such model file, alias or Hub repository "
            "(`infer list --catalog` shows the aliases; Hub references look like owner/repo:Q4_K_M)"
        )
    from infer.quant.fetch import CheckpointOnlyError, fetch_checkpoint, fetch_gguf
    projector: Path | None = None
    wanted: bool | str = (entry.mmproj or True) if mmproj and entry is not None else mmproj
    try:
        local, quant, projector = fetch_gguf(hub.repo, hub.quant, offline=offline, progress=progress,
                                             mmproj=wanted, ask=ask)
    except NetworkError as e:
        if entry is None or entry.embedded is None:
            raise
        raise type(e)(f"{e}; {reference} also comes embedded in a package, which runs offline: "
                      f"{entry.embedded.install_hint()}") from None
    except CheckpointOnlyError:  # safetensors only: convert on first use, as for a folder
        from infer.quant.build import DEFAULT_RUN_TYPE, converted_folder

        quant = (hub.quant or DEFAULT_RUN_TYPE).upper()
        folder = fetch_checkpoint(hub.repo, offline=offline, progress=progress)
        local = converted_folder(folder, repo=hub.repo, quant=quant, notice=notice)
    verify_gguf(local)
    return ResolvedModel(reference, local, entry, hub.repo, quant, mmproj=projector)


def _local_gguf(path: Path, reference: str) -> Path:
    if not path.exists():
        raise ModelNotFoundError(f"{reference}: no such file")
    split = SPLIT_PART.search(path.name)
    if split and split.group(1) != "00001":
        raise ModelError(
            f"{reference}: this is part {int(split.group(1))} of a split GGUF; "
            f"give the first part (-00001-of-{split.group(2)}.gguf)"
        )
    verify_gguf(path)
    return path.resolve()


def verify_gguf(path: Path) -> None:
    """Check `path` strictly, unless this very file (same size, mtime, inode) passed before.

    The full check walks every vocabulary string (about 0.1 s for a 128k vocabulary),
    too much to repeat on every one-shot run of an unchanged file.
    """
    st = path.stat()
    stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
    key = str(path.resolve())  # in the Hugging Face cache: the blob the snapshot link names
    memo_path = checked_gguf_memo()
    memo = _read_memo(memo_path)
    if memo.get(key) == stamp:
        return
    check_gguf(path)
    memo.pop(key, None)
    memo[key] = stamp
    while len(memo) > _MEMO_MAX:
        memo.pop(next(iter(memo)))
    with contextlib.suppress(OSError):  # a read-only home only costs the next run a full check
        write_atomic(memo_path, json.dumps(memo).encode())


def _read_memo(memo_path: Path) -> dict[str, list[int]]:
    try:
        data = json.loads(memo_path.read_bytes())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
