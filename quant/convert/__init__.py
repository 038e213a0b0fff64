"""Hugging Face safetensors checkpoints to GGUF, built on the `gguf` package.

``convert`` plans every output tensor from the safetensors headers, writes the
GGUF header, metadata and tensor table, then streams the tensors one at a time
(read by memory map, transformed, converted, written), so peak memory stays near
the largest tensor. The file is written under a temporary name and renamed when
complete; an error or Ctrl-C leaves nothing at the destination.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf.gguf_writer import WriterState

from infer.quant.convert import families
from infer.quant.convert.checkpoint import (
    Checkpoint,
    open_checkpoint,
    read_config,
    read_rows,
    read_tensor,
    to_bf16,
)
from infer.runtime.errors import ModelError, UsageError

SUPPORTED_ARCHITECTURES = tuple(families.FAMILIES)
OUT_TYPES = {"F32": gguf.LlamaFileType.ALL_F32, "F16": gguf.LlamaFileType.MOSTLY_F16,
             "BF16": gguf.LlamaFileType.MOSTLY_BF16}

# progress(tensor_name, index, count)
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class PlannedTensor:
    name: str  # GGUF name
    source: str | None  # checkpoint name; None for tensors computed here
    shape: tuple[int, ...]  # numpy order
    out_type: str  # F32, F16 or BF16


def check_architecture(config: dict[str, Any], where: str) -> str:
    """The checkpoint's architecture class, if infer can convert it; else a ModelError (exit 3)."""
    archs = config.get("architectures") or [None]
    arch = archs[0]
    if arch not in families.FAMILIES:
        raise ModelError(f"{where}: cannot convert architecture {arch!r}; supported: "
                         f"{', '.join(SUPPORTED_ARCHITECTURES)}")
    return str(arch)


def convert(folder: Path, out: Path, *, out_type: str = "F16", source_repo: str | None = None,
            progress: Progress | None = None) -> Path:
    """Convert the checkpoint in `folder` to a GGUF file at `out` (F32, F16 or BF16)."""
    out_type = out_type.upper()
    if out_type not in OUT_TYPES:
        raise UsageError(f"conversion writes F32, F16 or BF16, not {out_type}")
    arch = check_architecture(read_config(folder), str(folder))
    ckpt = open_checkpoint(folder)
    family = families.FAMILIES[arch]
    from infer.quant.convert import bert
    from infer.quant.convert.tokenizer import add_vocab, load_vocab

    vocab, finish = bert.load_encoder_vocab(folder) if not family.decoder else (load_vocab(folder), None)
    pooling = (gguf.PoolingType.RANK if arch.endswith("ForSequenceClassification")  # (a cross-encoder)
               else bert.pooling_type(folder))
    plan, extra = _plan(ckpt, family, out_type)
    tmp = out.with_name(f".{out.name}.partial")
    writer = gguf.GGUFWriter(tmp, gguf.MODEL_ARCH_NAMES[family.arch])
    try:
        _add_general(writer, ckpt, plan, out_type, source_repo)
        if family.decoder:
            families.add_hparams(writer, ckpt.config, family)
        else:
            bert.add_bert_hparams(writer, ckpt.config, family)
        if pooling is not None:  # an embedding model (sentence-transformers' pooling)
            writer.add_pooling_type(pooling)
        add_vocab(writer, vocab, n_vocab=int(ckpt.config["vocab_size"]))
        if finish is not None:
            finish(writer)
        for t in plan:
            writer.add_tensor_info(t.name, t.shape, np.dtype(np.float32 if t.out_type == "F32" else
                                                             np.float16 if t.out_type == "F16" else
                                                             np.uint16),
                                   _nbytes(t), raw_dtype=gguf.GGMLQuantizationType.BF16
                                   if t.out_type == "BF16" else None)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for i, t in enumerate(plan):
            if t.source is None:
                writer.write_tensor_data(_as_type(extra[t.name], t.out_type))
            elif families.transforms(family, t.name):
                data = families.transform(family, ckpt.config, t.name,
                                          read_tensor(ckpt.tensors[t.source]))
                writer.write_tensor_data(_as_type(data, t.out_type))
            else:
                _stream_rows(writer, ckpt.tensors[t.source], t)
            if progress is not None:
                progress(t.name, i + 1, len(plan))
        writer.close()
        tmp.replace(out)
    except BaseException:
        with contextlib.suppress(Exception):
            writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return out


def _plan(ckpt: Checkpoint, family: families.Family,
          out_type: str) -> tuple[list[PlannedTensor], dict[str, np.ndarray]]:
    n_layer = int(ckpt.config["num_hidden_layers"])
    names = gguf.get_tensor_name_map(family.arch, n_layer)
    plan: list[PlannedTensor] = []
    for source, tensor in ckpt.tensors.items():
        if families.ignored(source, ckpt.config):
            continue
        name = names.get_name(_renamed(source, ckpt.architecture), try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ModelError(f"{ckpt.folder}: unexpected tensor {source} for {ckpt.architecture}")
        shape = tuple(tensor.shape)
        if families.transforms(family, name) and name == "position_embd.weight":  # (RoBERTa's: cut)
            shape = (shape[0] - families.position_offset(ckpt.config, family), *shape[1:])
        plan.append(PlannedTensor(name, source, shape, _stored_type(name, shape, out_type)))
    extra = families.extra_tensors(ckpt.config)
    plan += [PlannedTensor(name, None, data.shape, "F32") for name, data in extra.items()]
    _check_complete(ckpt, family, {t.name for t in plan}, n_layer)
    return plan, extra


# Tables llama.cpp adds to F32 activations as they are (a BERT's token-type row, its position
# rows): in F16, ggml's CPU add aborts the process ("binary_op: unsupported types"). llama.cpp's
# converter keeps them F32 too.
_KEPT_F32 = (gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.TOKEN_TYPES], gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.POS_EMBD])


def _stored_type(name: str, shape: tuple[int, ...], out_type: str) -> str:
    """F32 for vectors (norms, biases) and the tables above, else the file's type."""
    return "F32" if len(shape) == 1 or name.removesuffix(".weight") in _KEPT_F32 else out_type


def _renamed(source: str, architecture: str) -> str:
    """A checkpoint's tensor name as gguf's name map knows it: without BERT's "bert." prefix (or
    RoBERTa's "roberta."); a BERT cross-encoder's pooler and classifier as llama.cpp's rank head
    (cls, then cls.output)."""
    source = source.removeprefix("bert.").removeprefix("roberta.")
    if architecture == "BertForSequenceClassification":
        if source.startswith("pooler.dense."):
            return "classifier.dense." + source.removeprefix("pooler.dense.")
        if source.startswith("classifier.") and not source.startswith("classifier.dense."):
            return "classifier.out_proj." + source.removeprefix("classifier.")
    return source


def _check_complete(ckpt: Checkpoint, family: families.Family, have: set[str], n_layer: int) -> None:
    required = [f"{t}.weight" for t in family.top]
    required += [f"blk.{b}.{t}.weight" for b in range(n_layer) for t in family.block]
    missing = [n for n in required if n not in have]
    if missing:
        raise ModelError(f"{ckpt.folder}: the checkpoint lacks {missing[0]}"
                         + (f" and {len(missing) - 1} more tensors" if len(missing) > 1 else ""))
    embedding = ckpt.architecture == "Qwen3Model"  # (an embedding model: no output layer to read)
    if (family.decoder and not embedding and "output.weight" not in have
            and not ckpt.config.get("tie_word_embeddings", False)):
        raise ModelError(f"{ckpt.folder}: the checkpoint lacks lm_head.weight")


ROWS_CHUNK_ELEMENTS = 1 << 22  # about 16 MB of float32 at a time


def _stream_rows(writer: gguf.GGUFWriter, tensor: Any, t: PlannedTensor) -> None:
    """Write one tensor's data a few rows at a time: memory stays at one chunk.

    GGUFWriter only writes whole tensors, so this follows its layout itself (padding
    before and after, the next tensor info taken off its queue), as write_tensor_data does.
    """
    fout = writer.fout[0]  # type: ignore[index]
    ti = writer.tensors[0].pop(next(iter(writer.tensors[0])))
    writer.write_padding(fout, fout.tell())
    rows = t.shape[0] if t.shape else 1
    per_row = int(np.prod(t.shape[1:], dtype=np.int64)) if len(t.shape) > 1 else 1
    step = max(1, ROWS_CHUNK_ELEMENTS // per_row)
    written = 0
    for start in range(0, rows, step):
        chunk = _as_type(read_rows(tensor, start, min(step, rows - start)), t.out_type)
        fout.write(chunk.tobytes())
        written += chunk.nbytes
    if written != ti.nbytes:
        raise ModelError(f"tensor {t.name}: wrote {written} bytes, expected {ti.nbytes}")
    writer.write_padding(fout, ti.nbytes)
    writer.state = WriterState.WEIGHTS


def _nbytes(t: PlannedTensor) -> int:
    return int(np.prod(t.shape)) * (4 if t.out_type == "F32" else 2)


def _as_type(data: np.ndarray, out_type: str) -> np.ndarray:
    if out_type == "F32":
        return np.ascontiguousarray(data, dtype=np.float32)
    if out_type == "F16":
        return np.ascontiguousarray(data, dtype=np.float16)
    return to_bf16(data)


def _add_general(writer: gguf.GGUFWriter, ckpt: Checkpoint, plan: list[PlannedTensor], out_type: str,
                 source_repo: str | None) -> None:
    name = source_repo.split("/")[-1] if source_repo else ckpt.folder.resolve().name
    writer.add_name(name)
    writer.add_basename(name)
    n_params = sum(int(np.prod(t.shape)) for t in plan if t.source is not None)
    writer.add_size_label(size_label(n_params))
    if source_repo:
        writer.add_source_repo_url(f"https://huggingface.co/{source_repo}")
    writer.add_file_type(OUT_TYPES[out_type])
    license_name = model_card_license(ckpt.folder / "README.md")
    if license_name:
        writer.add_license(license_name)
    generation = ckpt.folder / "generation_config.json"
    if generation.is_file():
        with contextlib.suppress(OSError, ValueError):
            _add_sampling(writer, json.loads(generation.read_text(encoding="utf-8")))


def _add_sampling(writer: gguf.GGUFWriter, config: dict[str, Any]) -> None:
    if not config.get("do_sample", True):
        return
    value = config.get("top_k")
    if isinstance(value, int) and not isinstance(value, bool):
        writer.add_sampling_top_k(value)
    for key, add in (("temperature", writer.add_sampling_temp), ("top_p", writer.add_sampling_top_p),
                     ("min_p", writer.add_sampling_min_p)):
        value = config.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            add(float(value))


def size_label(n_params: int) -> str:
    """`135M`, `1.5B`, `8B`: the GGUF naming convention's size part."""
    if n_params >= 1e9:
        return f"{n_params / 1e9:.1f}B".replace(".0B", "B")
    return f"{round(n_params / 1e6)}M"


def plan_tensors(folder: Path) -> tuple[str, list[tuple[str, tuple[int, ...]]]]:
    """The architecture and the GGUF tensors (name, shape) a conversion of `folder` writes."""
    arch = check_architecture(read_config(folder), str(folder))
    ckpt = open_checkpoint(folder)
    planned, _ = _plan(ckpt, families.FAMILIES[arch], "F32")
    return arch, [(t.name, tuple(reversed(t.shape))) for t in planned]


def model_card_license(readme: Path) -> str | None:
    """The `license:` of a model card's YAML front matter, if any."""
    try:
        text = readme.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if not text.startswith("---"):
        return None
    for line in text.split("\n---", 1)[0].splitlines()[1:]:
        key, _, value = line.partition(":")
        if key.strip() == "license" and value.strip():
            return value.strip().strip("'\"")
    return None
