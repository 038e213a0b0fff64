"""Option declarations shared by every command that runs a model, defined once.

Names follow llama.cpp's flags where they mean the same thing. A command lists
the aliases it takes in its signature; ``sampling_overrides`` and
``context_params`` then read them back from the click context by name, so no
parameter list is ever written out twice.
"""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from infer.runtime.errors import UsageError
from infer.runtime.params import ContextParams

SAMPLING = "Sampling"
SPECULATION = "Speculative decoding"
CONTEXT = "Context and hardware"
OUTPUT = "Output"

# --- sampling ---------------------------------------------------------------
MaxTokens = Annotated[int | None, typer.Option(
    "-n", "--max-tokens", help="Tokens to generate at most (-1: until the end or a full context).",
    rich_help_panel=SAMPLING)]
Temperature = Annotated[float | None, typer.Option(
    "--temp", "--temperature", help="Temperature; 0 is greedy and deterministic.",
    rich_help_panel=SAMPLING)]
TopK = Annotated[int | None, typer.Option("--top-k", help="Top-k sampling (0: off).",
                                             rich_help_panel=SAMPLING)]
TopP = Annotated[float | None, typer.Option("--top-p", help="Top-p (nucleus) sampling, in (0, 1].",
                                               rich_help_panel=SAMPLING)]
MinP = Annotated[float | None, typer.Option("--min-p", help="Min-p sampling, in [0, 1].",
                                               rich_help_panel=SAMPLING)]
TypicalP = Annotated[float | None, typer.Option("--typical-p", "--typical",
                                                   help="Locally typical sampling, in (0, 1].",
                                                   rich_help_panel=SAMPLING)]
RepeatPenalty = Annotated[float | None, typer.Option(
    "--repeat-penalty", help="Penalize repeated tokens (1.0: off).", rich_help_panel=SAMPLING)]
RepeatLastN = Annotated[int | None, typer.Option(
    "--repeat-last-n", help="Window of the repeat penalty in tokens (-1: whole context).",
    rich_help_panel=SAMPLING)]
PresencePenalty = Annotated[float | None, typer.Option("--presence-penalty",
                                                          rich_help_panel=SAMPLING)]
FrequencyPenalty = Annotated[float | None, typer.Option("--frequency-penalty",
                                                           rich_help_panel=SAMPLING)]
Seed = Annotated[int | None, typer.Option(
    "--seed", help="Random seed (-1: random). The same seed gives the same text.",
    rich_help_panel=SAMPLING)]
Mirostat = Annotated[int | None, typer.Option("--mirostat", help="Mirostat: 0 off, 1 or 2.",
                                                 rich_help_panel=SAMPLING)]
MirostatLr = Annotated[float | None, typer.Option("--mirostat-lr", help="Mirostat eta.",
                                                     rich_help_panel=SAMPLING)]
MirostatEnt = Annotated[float | None, typer.Option("--mirostat-ent", help="Mirostat tau.",
                                                      rich_help_panel=SAMPLING)]
DryMultiplier = Annotated[float | None, typer.Option("--dry-multiplier",
                                                        help="DRY repetition penalty (0: off).",
                                                        rich_help_panel=SAMPLING)]
DryBase = Annotated[float | None, typer.Option("--dry-base", rich_help_panel=SAMPLING)]
DryAllowedLength = Annotated[int | None, typer.Option("--dry-allowed-length",
                                                         rich_help_panel=SAMPLING)]
DryPenaltyLastN = Annotated[int | None, typer.Option("--dry-penalty-last-n",
                                                        rich_help_panel=SAMPLING)]
DrySequenceBreaker = Annotated[list[str] | None, typer.Option(
    "--dry-sequence-breaker", help="Repeatable; 'none' clears the defaults.",
    rich_help_panel=SAMPLING)]
XtcProbability = Annotated[float | None, typer.Option("--xtc-probability",
                                                         rich_help_panel=SAMPLING)]
XtcThreshold = Annotated[float | None, typer.Option("--xtc-threshold", rich_help_panel=SAMPLING)]
LogitBias = Annotated[list[str] | None, typer.Option(
    "--logit-bias", help="TOKEN_ID+BIAS or TOKEN_ID-BIAS, e.g. 15043+1 or 2-inf; repeatable.",
    rich_help_panel=SAMPLING)]
Stop = Annotated[list[str] | None, typer.Option(
    "--stop", help="Stop before this text (not printed); repeatable.", rich_help_panel=SAMPLING)]
Grammar = Annotated[str | None, typer.Option("--grammar", help="A GBNF grammar the output must follow.",
                                                rich_help_panel=SAMPLING)]
GrammarFile = Annotated[Path | None, typer.Option("--grammar-file", rich_help_panel=SAMPLING)]
JsonSchema = Annotated[str | None, typer.Option(
    "--json-schema", help="A JSON schema the output must follow: inline JSON or @file.",
    rich_help_panel=SAMPLING)]
IgnoreEos = Annotated[bool, typer.Option("--ignore-eos", help="Never stop at end-of-generation tokens.",
                                         rich_help_panel=SAMPLING)]

# --- context and hardware ---------------------------------------------------
CtxSize = Annotated[int | None, typer.Option(
    "-c", "--ctx-size", help="Context size in tokens (default: the model's, at most 4096).",
    rich_help_panel=CONTEXT)]
BatchSize = Annotated[int, typer.Option("-b", "--batch-size", help="Prompt tokens per decode call.",
                                        rich_help_panel=CONTEXT)]
UbatchSize = Annotated[int, typer.Option("-ub", "--ubatch-size", help="Physical batch size.",
                                         rich_help_panel=CONTEXT)]
Threads = Annotated[int | None, typer.Option("-t", "--threads",
                                                help="CPU threads (default: physical cores).",
                                                rich_help_panel=CONTEXT)]
GpuLayers = Annotated[str | None, typer.Option(
    "-ngl", "--gpu-layers", "--n-gpu-layers", metavar="N|auto|all",
    help="Layers to offload to GPUs and --rpc workers (default auto: as many as fit; -1 or all: every one).",
    rich_help_panel=CONTEXT, show_default=False)]
TensorSplit = Annotated[str | None, typer.Option(
    "-ts", "--tensor-split", metavar="W,W,...",
    help="How to share the offloaded layers among the devices, workers first (e.g. 3,1).",
    rich_help_panel=CONTEXT, show_default=False)]
Rpc = Annotated[str | None, typer.Option(
    "--rpc", metavar="HOST:PORT,...",
    help="Add the devices of these 'infer worker' processes and split the model across them.",
    rich_help_panel=CONTEXT, show_default=False)]
# run and chat: the KV states of long prompts kept in INFER_HOME/cache/prompts.
NO_CACHE = ("no_cache", Annotated[bool, typer.Option(
    "--no-cache", help="Do not use or fill the prompt cache on disk (infer cache list).")], False)
# run and batch: send the work to a running `infer serve` instead of loading the model.
SERVER = ("server", Annotated[str | None, typer.Option(
    "--server", help="Send the request to this running `infer serve` (http://HOST:PORT or unix:PATH) instead "
                     "of loading the model here (default: $INFER_SERVER).", show_default=False)], None)
Explain = Annotated[bool, typer.Option(
    "--explain", help="Print where the model would go in memory (the plan) and exit.",
    rich_help_panel=CONTEXT)]
FlashAttn = Annotated[str, typer.Option("-fa", "--flash-attn", help="Flash attention: on, off or auto.",
                                        rich_help_panel=CONTEXT)]
CacheTypeK = Annotated[str, typer.Option("-ctk", "--cache-type-k",
                                         help="KV cache type for K: f16, q8_0, q4_0...",
                                         rich_help_panel=CONTEXT)]
CacheTypeV = Annotated[str, typer.Option("-ctv", "--cache-type-v",
                                         help="KV cache type for V (quantized types need -fa on).",
                                         rich_help_panel=CONTEXT)]
NoMmap = Annotated[bool, typer.Option("--no-mmap", help="Read the model into memory instead of mapping it.",
                                      rich_help_panel=CONTEXT)]

# --- speculative decoding (names as llama.cpp's) --------------------------------------------
SpecType = Annotated[str | None, typer.Option(
    "--spec-type", metavar="auto|none|ngram|draft",
    help="Guess tokens and verify them in one step: auto (prompt lookup whenever it pays; the "
         "default), none, ngram (prompt lookup), draft (needs -md).", rich_help_panel=SPECULATION,
    show_default=False)]
ModelDraft = Annotated[str | None, typer.Option(
    "-md", "--model-draft", metavar="MODEL",
    help="A small model of the same vocabulary that drafts tokens (any name infer run takes).",
    rich_help_panel=SPECULATION, show_default=False)]
SpecDraftNMax = Annotated[int | None, typer.Option(
    "--spec-draft-n-max", help="Tokens guessed per step at most (default 16).",
    rich_help_panel=SPECULATION, show_default=False)]
SpecDraftNMin = Annotated[int | None, typer.Option(
    "--spec-draft-n-min",
    help="Guess at least this many or none (default 0; equal to the max: a fixed length).",
    rich_help_panel=SPECULATION, show_default=False)]
DraftPMin = Annotated[float | None, typer.Option(
    "--draft-p-min", help="A draft model's guess must be this likely (default 0.75).",
    rich_help_panel=SPECULATION, show_default=False)]
SpecNgramSize = Annotated[int | None, typer.Option(
    "--spec-ngram-size", help="Prompt lookup: the longest n-gram looked up (default 4).",
    rich_help_panel=SPECULATION, show_default=False)]

Offline = Annotated[bool, typer.Option(
    "--offline", help="Use only models already in the cache (like HF_HUB_OFFLINE=1).")]

Verbose = Annotated[bool, typer.Option("-v", "--verbose",
                                       help="Statistics and llama.cpp's log on stderr.",
                                       rich_help_panel=OUTPUT)]

# Click parameter name -> SamplingParams field, for flags whose value is used as is.
_SAMPLING_FLAGS = {
    "temp": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
    "typical_p": "typical_p", "repeat_penalty": "repeat_penalty",
    "repeat_last_n": "repeat_last_n", "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty", "mirostat": "mirostat",
    "mirostat_lr": "mirostat_eta", "mirostat_ent": "mirostat_tau",
    "dry_multiplier": "dry_multiplier", "dry_base": "dry_base",
    "dry_allowed_length": "dry_allowed_length", "dry_penalty_last_n": "dry_penalty_last_n",
    "xtc_probability": "xtc_probability", "xtc_threshold": "xtc_threshold",
    "ignore_eos": "ignore_eos",
}


def resolve(flags: Mapping[str, Any]) -> Any:
    """The model the MODEL argument names, downloaded with progress on stderr if needed."""
    from infer.cli.progress import DownloadProgress
    from infer.quant.registry import resolve_model

    def notice(text: str) -> None:
        sys.stderr.write(f"infer: {text}\n")
        sys.stderr.flush()

    with DownloadProgress() as progress:
        return resolve_model(flags["model"], offline=flags.get("offline", False), progress=progress,
                             notice=notice)


def read_text_file(path: str | Path, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{what} {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{what} {path}: cannot be read ({e})") from None


def sampling_overrides(flags: Mapping[str, Any]) -> dict[str, Any]:
    """The SamplingParams fields the user set explicitly, from a command's parsed flags."""
    out: dict[str, Any] = {}
    for flag, name in _SAMPLING_FLAGS.items():
        value = flags.get(flag)
        if value is not None and value is not False:
            out[name] = value
    max_tokens = flags.get("max_tokens")
    if max_tokens is not None:
        out["max_tokens"] = None if max_tokens == -1 else max_tokens
    seed = flags.get("seed")
    if seed is not None and seed != -1:
        out["seed"] = seed
    if flags.get("stop"):
        out["stop"] = tuple(flags["stop"])
    breakers = flags.get("dry_sequence_breaker")
    if breakers:
        out["dry_sequence_breakers"] = () if breakers == ["none"] else tuple(breakers)
    if flags.get("logit_bias"):
        from infer.runtime.sampling import parse_logit_bias

        out["logit_bias"] = tuple(parse_logit_bias(s) for s in flags["logit_bias"])
    grammar, grammar_file = flags.get("grammar"), flags.get("grammar_file")
    if grammar is not None and grammar_file is not None:
        raise UsageError("give --grammar or --grammar-file, not both")
    if grammar_file is not None:
        grammar = read_text_file(grammar_file, "grammar file")
    if grammar is not None:
        out["grammar"] = grammar
    schema = flags.get("json_schema")
    if schema is not None:
        if schema.startswith("@"):
            schema = read_text_file(Path(schema[1:]), "JSON schema file")
        out["json_schema"] = schema
    return out


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


def model_context_params(flags: Mapping[str, Any], entry: Any) -> ContextParams:
    """context_params, with a catalog alias's context size unless --ctx-size was given."""
    cparams = context_params(flags)
    if entry and entry.ctx_size and flags.get("ctx_size") is None:
        cparams = replace(cparams, n_ctx=entry.ctx_size)
    return cparams


def model_sampling_defaults(model: Any, entry: Any) -> dict[str, Any]:
    """The model's recommended sampling (GGUF metadata), then its catalog alias's."""
    from infer.runtime.sampling import model_sampling_defaults as from_metadata

    defaults = from_metadata(model.meta)
    if entry:
        defaults.update(entry.sampling)
    return defaults


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


def context_params(flags: Mapping[str, Any]) -> ContextParams:
    """ContextParams from a command's parsed flags (validated; UsageError if out of range)."""
    return ContextParams(
        n_ctx=flags.get("ctx_size") or None,  # 0 means the default, as in llama.cpp
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
    )


# (name, declaration, default) of every option a model-running command takes.
_MODEL_OPTIONS: tuple[tuple[str, Any, Any], ...] = (
    ("verbose", Verbose, False), ("offline", Offline, False),
    ("max_tokens", MaxTokens, None), ("temp", Temperature, None), ("top_k", TopK, None),
    ("top_p", TopP, None), ("min_p", MinP, None), ("typical_p", TypicalP, None),
    ("repeat_penalty", RepeatPenalty, None), ("repeat_last_n", RepeatLastN, None),
    ("presence_penalty", PresencePenalty, None), ("frequency_penalty", FrequencyPenalty, None),
    ("seed", Seed, None), ("mirostat", Mirostat, None), ("mirostat_lr", MirostatLr, None),
    ("mirostat_ent", MirostatEnt, None), ("dry_multiplier", DryMultiplier, None),
    ("dry_base", DryBase, None), ("dry_allowed_length", DryAllowedLength, None),
    ("dry_penalty_last_n", DryPenaltyLastN, None), ("dry_sequence_breaker", DrySequenceBreaker, None),
    ("xtc_probability", XtcProbability, None), ("xtc_threshold", XtcThreshold, None),
    ("logit_bias", LogitBias, None), ("stop", Stop, None), ("grammar", Grammar, None),
    ("grammar_file", GrammarFile, None), ("json_schema", JsonSchema, None),
    ("ignore_eos", IgnoreEos, False), ("ctx_size", CtxSize, None), ("batch_size", BatchSize, 2048),
    ("ubatch_size", UbatchSize, 512), ("threads", Threads, None), ("gpu_layers", GpuLayers, None),
    ("flash_attn", FlashAttn, "auto"), ("cache_type_k", CacheTypeK, "f16"),
    ("cache_type_v", CacheTypeV, "f16"), ("no_mmap", NoMmap, False),
    ("tensor_split", TensorSplit, None), ("rpc", Rpc, None), ("explain", Explain, False),
    ("spec_type", SpecType, None), ("model_draft", ModelDraft, None),
    ("spec_draft_n_max", SpecDraftNMax, None), ("spec_draft_n_min", SpecDraftNMin, None),
    ("draft_p_min", DraftPMin, None), ("spec_ngram_size", SpecNgramSize, None),
)


def defaults(command: Callable[..., Any]) -> dict[str, Any]:
    """Each flag of a `model_command` and its default value."""
    return {name: p.default for name, p in inspect.signature(command).parameters.items() if name != "ctx"}


def model_command(*own: tuple[str, Any, Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command `fn(ctx, **flags)` its own parameters plus every shared model option.

    Typer reads a command's parameters from its signature; setting the signature here
    declares the shared sampling, context and output options once for every command.
    """
    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        kw = inspect.Parameter.KEYWORD_ONLY
        params = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                    annotation=typer.Context)]
        params += [inspect.Parameter(name, kw, annotation=decl, default=default)
                   for name, decl, default in (*own, *_MODEL_OPTIONS)]
        fn.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        return fn
    return decorate


def log_to_stderr() -> None:
    """-v/--verbose: llama.cpp's log (through `logging`) on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("infer")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
