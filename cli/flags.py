"""A command's parsed flags (parameter name -> value) read into the library's parameters.

Typer declares the flags (cli/options.py) and parses them; so does cli/plain_args.py
for a plain `infer run`, without importing Typer. Either way the values arrive here
as one mapping, and each reader picks the flags it needs by name.
"""

from __future__ import annotations

import os
import sys

from infer.runtime.errors import UsageError

TYPE_CHECKING = False  # (typing, collections.abc and the params' dataclasses cost start-up)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path
    from typing import Any

    from infer.runtime.params import ContextParams

def resolve(flags: Mapping[str, Any], *, ask: bool = False) -> Any:
    """The model the MODEL argument names, downloaded with progress on stderr if needed (`ask`:
    a cached Hub model's listing read again, for infer pull)."""
    from infer.cli.progress import DownloadProgress
    from infer.quant.registry import resolve_model

    def notice(text: str) -> None:
        sys.stderr.write(f"infer: {text}\n")
        sys.stderr.flush()

    with DownloadProgress() as progress:
        return resolve_model(flags["model"], offline=flags.get("offline", False), progress=progress,
                             notice=notice, mmproj=not flags.get("no_mmproj", False), ask=ask)


def read_text_file(path: str | Path, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise UsageError(f"{what} {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{what} {path}: cannot be read ({e})") from None


def sampling_overrides(flags: Mapping[str, Any]) -> dict[str, Any]:
    """The SamplingParams fields the user set explicitly, from a command's parsed flags (named
    as the fields: cli/options.py declares one flag per entry of runtime/request_params.py)."""
    from infer.runtime.request_params import SAMPLING, parse_logit_bias

    out: dict[str, Any] = {}
    for p in SAMPLING.values():
        value = flags.get(p.field)
        if value is None or value is False or value == [] or value == ():
            continue
        if p.flag_none is not None and value == p.flag_none:  # llama.cpp's -1: no limit, a random seed
            out[p.field] = None
        elif p.field == "dry_sequence_breakers":
            out[p.field] = () if list(value) == ["none"] else tuple(value)
        elif p.kind == "biases":
            out[p.field] = tuple(parse_logit_bias(s) for s in value)
        else:
            out[p.field] = tuple(value) if p.kind == "texts" else value
    grammar, grammar_file = out.get("grammar"), flags.get("grammar_file")
    if grammar is not None and grammar_file is not None:
        raise UsageError("give --grammar or --grammar-file, not both")
    if grammar_file is not None:
        out["grammar"] = read_text_file(grammar_file, "grammar file")
    schema = out.get("json_schema")
    if schema is not None and schema.startswith("@"):
        out["json_schema"] = read_text_file(schema[1:], "JSON schema file")
    return out


def prompt_settings(flags: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """--think's level and --chat-template-kwargs' variables, checked before anything loads."""
    import json

    from infer.runtime.request_params import PARAMS

    think = flags.get("think")
    if think is not None:
        think = think.strip().lower()
        if think not in PARAMS["think"].choices:
            raise UsageError(f"--think {flags['think']!r}: give one of {', '.join(PARAMS['think'].choices)}")
    text = flags.get("chat_template_kwargs")
    if text is None:
        return think, {}
    try:
        variables = json.loads(text)
    except ValueError as e:
        raise UsageError(f"--chat-template-kwargs is not valid JSON: {e}") from None
    if not isinstance(variables, dict):
        raise UsageError("--chat-template-kwargs must be a JSON object, e.g. '{\"enable_thinking\": false}'")
    return think, variables


def reasoning_budget(flags: Mapping[str, Any]) -> int | None:
    """--reasoning-budget, checked (None: no limit)."""
    from infer.runtime.request_params import out_of_range

    value = flags.get("reasoning_budget")
    problem = None if value is None else out_of_range("reasoning_budget", value, "--reasoning-budget")
    if problem is not None:
        raise UsageError(problem)
    return None if value is None or value < 0 else value


def prompt_flags(flags: Mapping[str, Any]) -> dict[str, Any]:
    """The flags of runtime/request_params.py's "prompt" group (--think, --chat-template-kwargs,
    --reasoning-budget) as given, the form chat's /set and batch's lines override them in."""
    from infer.runtime.request_params import PARAMS

    return {name: flags.get(name) for name, p in PARAMS.items() if p.group == "prompt"}


def thinking_request(flags: Mapping[str, Any]) -> Any:
    """--think, --chat-template-kwargs and --reasoning-budget as a runtime.thinking.ThinkingRequest."""
    from infer.runtime.thinking_prompt import ThinkingRequest

    think, variables = prompt_settings(flags)
    return ThinkingRequest(think, variables, reasoning_budget(flags))


def spec_params(flags: Mapping[str, Any]) -> Any:
    """SpecParams from the --spec-* flags (validated); -md/--model-draft implies --spec-type draft."""
    from infer.runtime.speculative import SpecParams

    kind = (flags.get("spec_type") or "").lower() or None
    if flags.get("model_draft"):
        if kind in ("none", "ngram"):
            raise UsageError(f"-md/--model-draft drafts with a model; it cannot go with --spec-type {kind}")
        kind = "draft"
    elif kind == "draft":
        raise UsageError("--spec-type draft needs a draft model: -md/--model-draft MODEL")
    given = {"type": kind, "n_max": flags.get("spec_draft_n_max"), "n_min": flags.get("spec_draft_n_min"),
             "p_min": flags.get("draft_p_min"), "ngram_size": flags.get("spec_ngram_size")}
    return SpecParams(**{k: v for k, v in given.items() if v is not None})


def load_plan(flags: Mapping[str, Any], resolved: Any, *, slots: Any = None) -> Any:
    """Where the resolved model goes with the context flags (runtime.loading.plan_load), and
    with --rpc the guard that turns a lost worker into exit 4."""
    from infer.cli.media import projector_path
    from infer.runtime.loading import plan_load

    cparams = context_params(flags)
    projector = projector_path(flags, resolved)
    reserve = os.path.getsize(projector) if projector is not None and os.path.isfile(projector) else 0
    plan = plan_load(resolved, cparams, slots=slots, reserve=reserve)
    if cparams.rpc:
        from infer.cli.placement import guard_workers

        guard_workers(cparams.rpc)
    return plan


def parse_gpu_layers(value: str | int | None) -> int | None:
    """-ngl: None for auto, -1 for all, else a count."""
    if value is None or str(value).strip().lower() == "auto":
        return None
    text = str(value).strip().lower()
    if text in ("all", "max"):
        return -1
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"-ngl {value!r}: expected a number of layers, auto or all") from None


def parse_tensor_split(text: str | None) -> tuple[float, ...]:
    if not text:
        return ()
    try:
        return tuple(float(x) for x in text.replace("/", ",").split(","))
    except ValueError:
        raise UsageError(f"--tensor-split {text!r}: expected weights like 3,1") from None


def parse_rpc(text: str | None) -> tuple[str, ...]:
    if not text:
        return ()
    from infer.runtime.ggml import parse_endpoint

    endpoints = tuple(e.strip() for e in text.split(",") if e.strip())
    for e in endpoints:
        parse_endpoint(e)
    if not endpoints:
        raise UsageError("--rpc needs HOST:PORT[,HOST:PORT...]")
    return endpoints


NO_REPACK_VARIABLE = "INFER_NO_REPACK"


def repack_wanted(flags: Mapping[str, Any]) -> bool:
    """Whether llama.cpp may repack weights (unless its check found that it crashes here):
    not with --no-repack or INFER_NO_REPACK=1. The check's verdict is kept in INFER_HOME."""
    remember_checks()
    return not (flags.get("no_repack") or repack_off_by_environment())


def repack_off_by_environment() -> bool:
    return os.environ.get(NO_REPACK_VARIABLE, "").strip() not in ("", "0")


def remember_checks() -> None:
    """Keep what the runtime checks once per machine (runtime/repack.py) in INFER_HOME."""
    from infer.quant.paths import repack_memo
    from infer.runtime import repack

    repack.remember_in(repack_memo)


def context_params(flags: Mapping[str, Any]) -> ContextParams:
    """ContextParams from a command's parsed flags (validated; UsageError if out of range)."""
    from infer.runtime.params import ContextParams

    return ContextParams(
        n_ctx=flags.get("ctx_size"),  # 0: the model's training context, as llama.cpp's -c 0
        n_batch=flags.get("batch_size") or 2048,
        n_ubatch=flags.get("ubatch_size") or 512,
        n_threads=flags.get("threads"),
        n_gpu_layers=parse_gpu_layers(flags.get("gpu_layers")),
        tensor_split=parse_tensor_split(flags.get("tensor_split")),
        rpc=parse_rpc(flags.get("rpc")),
        flash_attn=(flags.get("flash_attn") or "auto").lower(),
        cache_type_k=(flags.get("cache_type_k") or "f16").lower(),
        cache_type_v=(flags.get("cache_type_v") or "f16").lower(),
        use_mmap=not flags.get("no_mmap", False),
        repack=repack_wanted(flags),
    )


def log_to_stderr() -> None:
    """-v/--verbose: llama.cpp's log (through `logging`) on stderr."""
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("infer")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
