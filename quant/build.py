"""`infer quantize` as a library call: source -> (conversion) -> quantization -> a named GGUF.

Sources: a Hugging Face model folder, a Hub repository with safetensors, a
``models.toml`` alias (its source repository), or a GGUF file (re-quantized).
Outputs go to ``$INFER_HOME/models/<Name>-<Size>-<TYPE>.gguf`` by default, where
``infer run <Name>-<Size>-<TYPE>`` finds them.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from infer.quant import quantize as q
from infer.quant.catalog import load_catalog
from infer.quant.check import QualityReport, quality
from infer.quant.convert import check_architecture, convert, size_label
from infer.quant.convert.checkpoint import open_checkpoint, read_config
from infer.quant.gguf_check import check_gguf
from infer.quant.hub_reference import parse_hub_reference
from infer.quant.paths import models_dir
from infer.runtime.errors import ModelNotFoundError, ResourceError

# progress(stage, item, index, count): stage is "download", "convert" or "quantize"
Progress = Callable[[str, str, int, int], None]
_HAS_SIZE = re.compile(r"(?<![A-Za-z0-9])\d+(\.\d+)?[MBK](?![A-Za-z0-9])", re.IGNORECASE)


@dataclass(frozen=True)
class Source:
    kind: str  # "hf" (a checkpoint folder) or "gguf"
    path: Path
    repo: str | None = None


def find_source(reference: str, *, offline: bool = False,
                progress: Callable[[str, int, int], None] | None = None) -> Source:
    """Where the weights to quantize come from; downloads a Hub checkpoint when needed."""
    path = Path(reference).expanduser()
    if path.is_dir():
        check_architecture(read_config(path), reference)
        return Source("hf", path)
    if path.is_file():
        check_gguf(path)
        return Source("gguf", path)
    from infer.quant.fetch import fetch_checkpoint

    entry = load_catalog().get(reference)
    hub = parse_hub_reference(entry.source if entry else reference)
    if hub is None:
        raise ModelNotFoundError(f"{reference}: no such folder, GGUF file, alias or Hub repository")
    return Source("hf", fetch_checkpoint(hub.repo, offline=offline, progress=progress), hub.repo)


def output_name(source: Source, quant: str) -> str:
    """`<Name>-<Size>-<TYPE>.gguf`, following the GGUF naming convention."""
    if source.kind == "gguf":
        meta = check_gguf(source.path).metadata
        name = str(meta.get("general.basename") or meta.get("general.name") or source.path.stem)
        size = str(meta.get("general.size_label") or "")
    else:
        name = source.repo.split("/")[-1] if source.repo else source.path.resolve().name
        ckpt = open_checkpoint(source.path)
        size = size_label(sum(_count(t.shape) for t in ckpt.tensors.values()))
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "model"
    if size and not _HAS_SIZE.search(name):
        name = f"{name}-{size}"
    return f"{name}-{quant}.gguf"


@dataclass(frozen=True)
class BuildResult:
    path: Path
    quality: QualityReport | None = None  # when checked against a full-precision source


FLOAT_TYPES = frozenset({0, 1, 30})  # ggml F32, F16, BF16


def build(source: Source, quant: str, out: Path | None = None, *, threads: int = 0,
          imatrix: Path | None = None, check: bool | None = None, repack: bool = True,
          progress: Progress | None = None) -> BuildResult:
    """Convert (if needed) and quantize `source` to `quant`; optionally measure what it cost.

    `check` None means: check when the source is full precision and the target is not;
    `repack` False: the check loads both models without repacking (llama.cpp's -nr).
    """
    quant, _ = q.file_type(quant, imatrix=imatrix)
    out = out or models_dir() / output_name(source, quant)
    out.parent.mkdir(parents=True, exist_ok=True)
    full_target = quant in ("F32", "F16", "BF16")
    if source.kind == "gguf":
        _check_space(out.parent, source.path.stat().st_size)
        q.quantize(source.path, out, quant, threads=threads, imatrix=imatrix,
                   progress=_stage(progress, "quantize"))
        wanted = check if check is not None else (not full_target and _is_full_precision(source.path))
        report = quality(source.path, out, threads=threads or None, repack=repack) if wanted else None
        return BuildResult(out, report)
    ckpt = open_checkpoint(source.path)
    _check_space(out.parent, sum(t.data_range.size for t in ckpt.tensors.values()))
    if full_target:
        convert(source.path, out, out_type=quant, source_repo=source.repo,
                progress=_stage(progress, "convert"))
        return BuildResult(out)
    keep = "BF16" if ckpt.source_dtype() == "BF16" else "F32" if ckpt.source_dtype() == "F32" else "F16"
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".convert-") as tmp:
        intermediate = convert(source.path, Path(tmp) / f"model-{keep}.gguf", out_type=keep,
                               source_repo=source.repo, progress=_stage(progress, "convert"))
        q.quantize(intermediate, out, quant, threads=threads, imatrix=imatrix,
                   progress=_stage(progress, "quantize"))
        report = (quality(intermediate, out, threads=threads or None, repack=repack)
                  if check is not False else None)
    return BuildResult(out, report)


def _is_full_precision(path: Path) -> bool:
    types = [t.ggml_type for t in check_gguf(path).tensors if len(t.shape) >= 2]
    return bool(types) and all(t in FLOAT_TYPES for t in types)


def _stage(progress: Progress | None, stage: str) -> Callable[[str, int, int], None] | None:
    if progress is None:
        return None
    return lambda item, i, n: progress(stage, item, i, n)


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _check_space(folder: Path, needed: int) -> None:
    free = shutil.disk_usage(folder).free
    if free < needed * 1.1:
        raise ResourceError(f"{folder}: {free / 1e9:.1f} GB free, about {needed / 1e9:.1f} GB needed")


DEFAULT_RUN_TYPE = "Q4_K_M"


def converted_folder(folder: Path, *, repo: str | None = None, quant: str = DEFAULT_RUN_TYPE,
                     notice: Callable[[str], None] | None = None) -> Path:
    """The cached conversion of a checkpoint (Q4_K_M by default); made on first use or when it changed."""
    check_architecture(read_config(folder), repo or str(folder))
    source = Source("hf", folder, repo)
    out = models_dir() / output_name(source, quant)
    newest = max((p.stat().st_mtime for p in folder.iterdir() if p.is_file()), default=0.0)
    if out.is_file() and out.stat().st_mtime >= newest:
        return out
    if notice is not None:
        notice(f"converting {repo or folder} to {out.name} (first use; kept for next time)")
    return build(source, quant, out, check=False).path


@dataclass(frozen=True)
class Plan:
    """What `infer quantize` would write, without writing anything (--dry-run)."""

    architecture: str
    parameters: int
    tensors: list[tuple[str, tuple[int, ...], str]]  # GGUF name, shape, target type
    estimated_bytes: int


def plan(source: Source, quant: str) -> Plan:
    """Each tensor's target type and the output's estimated size."""
    from infer.quant.convert import plan_tensors
    from infer.quant.gguf_check import GGML_TYPES

    quant, _ = q.file_type(quant)
    if source.kind == "gguf":
        info = check_gguf(source.path)
        arch = info.architecture or "unknown"
        shapes = [(t.name, t.shape) for t in info.tensors]
    else:
        arch, shapes = plan_tensors(source.path)
    base = _base_type(quant, {name for name, _, _ in GGML_TYPES.values()})
    sizes = {name: (block, size) for name, block, size in GGML_TYPES.values()}
    rows, total, params = [], 0, 0
    for name, shape in shapes:
        n = 1
        for d in shape:
            n *= d
        target = "F32" if len(shape) == 1 else base
        block, size = sizes[target]
        rows.append((name, shape, target))
        total += n * size // block
        params += n
    return Plan(arch, params, rows, total)


def _base_type(quant: str, ggml_names: set[str]) -> str:
    """The ggml tensor type a llama.cpp file type mostly uses (Q4_K_M -> Q4_K)."""
    special = {"IQ3_M": "IQ3_S", "IQ2_M": "IQ2_S", "MXFP4_MOE": "MXFP4", "Q2_K_S": "Q2_K"}
    if quant in special:
        return special[quant]
    if quant in ggml_names:
        return quant
    return re.sub(r"_[SML]$", "", quant)
