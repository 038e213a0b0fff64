"""Option declarations shared by every command that runs a model, defined once.

Names follow llama.cpp's flags where they mean the same thing. A command lists
the aliases it takes in its signature; the readers in cli/flags.py
(``sampling_overrides``, ``context_params``...) then take them from the parsed
parameters by name, so no parameter list is ever written out twice.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

SAMPLING = "Sampling"
SPECULATION = "Speculative decoding"
CONTEXT = "Context and hardware"
OUTPUT = "Output"
THINKING = "Thinking"
TOOLS = "Tool calling"

# --- sampling: one option per entry of the request parameters' table (runtime/request_params.py)
_FLAG_TYPES: dict[str, Any] = {"int": int | None, "float": float | None, "bool": bool, "text": str | None,
                               "texts": list[str] | None, "biases": list[str] | None}


def _sampling_options() -> tuple[tuple[str, Any, Any], ...]:
    """(name, declaration, default) of each request parameter that has a flag, in the table's order,
    with --grammar-file beside --grammar."""
    from infer.runtime.request_params import SAMPLING as SAMPLING_PARAMS

    out: list[tuple[str, Any, Any]] = []
    for p in SAMPLING_PARAMS.values():
        if p.flags:
            option = typer.Option(*p.flags, help=p.help, rich_help_panel=SAMPLING)
            out.append((p.field, Annotated[_FLAG_TYPES[p.kind], option], False if p.kind == "bool" else None))
        if p.field == "grammar":
            out.append(("grammar_file", GrammarFile, None))
    return tuple(out)


GrammarFile = Annotated[Path | None, typer.Option(
    "--grammar-file", help="A file holding the GBNF grammar the output must follow.",
    rich_help_panel=SAMPLING)]

# --- context and hardware ---------------------------------------------------
CtxSize = Annotated[int | None, typer.Option(
    "-c", "--ctx-size", help="Context size in tokens (default: the model's, at most 4096; 0: the model's "
                             "whole training context, as llama.cpp's -c 0).",
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
# run and chat: the model's chat template replaced.
CHAT_TEMPLATE_FILE = ("chat_template_file", Annotated[Path | None, typer.Option(
    "--chat-template-file", help="A Jinja chat template to use instead of the model's.")], None)
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
NoRepack = Annotated[bool, typer.Option(
    "-nr", "--no-repack", help="Keep the weights as the file has them: no repacking into faster CPU "
    "layouts (AMX, CPU_REPACK), as llama.cpp's -nr (also INFER_NO_REPACK=1). infer turns it off by "
    "itself where a check finds it crashes this CPU.", rich_help_panel=CONTEXT)]

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

# (name, declaration, default) of every option a model-running command takes.
_MODEL_OPTIONS: tuple[tuple[str, Any, Any], ...] = (
    ("verbose", Verbose, False), ("offline", Offline, False),
    *_sampling_options(),
    ("ctx_size", CtxSize, None), ("batch_size", BatchSize, 2048),
    ("ubatch_size", UbatchSize, 512), ("threads", Threads, None), ("gpu_layers", GpuLayers, None),
    ("flash_attn", FlashAttn, "auto"), ("cache_type_k", CacheTypeK, "f16"),
    ("cache_type_v", CacheTypeV, "f16"), ("no_mmap", NoMmap, False),
    ("no_repack", NoRepack, False),
    ("tensor_split", TensorSplit, None), ("rpc", Rpc, None), ("explain", Explain, False),
    ("spec_type", SpecType, None), ("model_draft", ModelDraft, None),
    ("spec_draft_n_max", SpecDraftNMax, None), ("spec_draft_n_min", SpecDraftNMin, None),
    ("draft_p_min", DraftPMin, None), ("spec_ngram_size", SpecNgramSize, None),
)


# (name, declaration, default) of the options of a command that loads a model to read texts, not
# to generate (infer embed, infer rerank): no sampling, and no context beyond its batch.
ENCODER_OPTIONS: tuple[tuple[str, Any, Any], ...] = (
    ("threads", Threads, None), ("gpu_layers", GpuLayers, None), ("flash_attn", FlashAttn, "auto"),
    ("no_mmap", NoMmap, False), ("no_repack", NoRepack, False), ("offline", Offline, False),
    ("verbose", Verbose, False),
)


def with_options(shared: tuple[tuple[str, Any, Any], ...]) -> Callable[[Callable[..., Any]],
                                                                      Callable[..., Any]]:
    """Give a command `fn(ctx, <its own parameters>, **flags)` the `shared` options after its own
    (Typer reads a command's parameters from its signature)."""
    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        own = [p for p in inspect.signature(fn, eval_str=True).parameters.values()  # (its annotations read)
               if p.kind is not p.VAR_KEYWORD]
        fn.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
            *own, *(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=decl, default=default)
                    for name, decl, default in shared)])
        return fn
    return decorate


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


def prompt_options() -> tuple[tuple[str, Any, Any], ...]:
    """(name, declaration, default) of the request parameters that change how the chat prompt
    is rendered (--think, --chat-template-kwargs), for the commands that render one."""
    from infer.runtime.request_params import PARAMS

    return tuple((p.field, Annotated[_FLAG_TYPES[p.kind], typer.Option(
        *p.flags, help=p.help, rich_help_panel=THINKING, show_default=False,
        metavar="|".join(p.choices) if p.choices else "N" if p.kind == "int" else "JSON")], None)
        for p in PARAMS.values() if p.group == "prompt")


def tool_options() -> tuple[tuple[str, Any, Any], ...]:
    """--tools and --tool-choice (the table's "tools" group), for the commands that render a chat."""
    from infer.runtime.request_params import PARAMS

    return tuple((p.field, Annotated[_FLAG_TYPES[p.kind], typer.Option(
        *p.flags, help=p.help, rich_help_panel=TOOLS, show_default=False,
        metavar="JSON|@FILE" if p.field == "tools" else "auto|none|required|NAME")], None)
        for p in PARAMS.values() if p.group == "tools" and p.flags)


def thinking_options() -> tuple[tuple[str, Any, Any], ...]:
    """The thinking options of the commands that show a reply (run, chat): the prompt's
    (--think...) and where the reasoning is shown (cli/thinking_display.py)."""
    return (*prompt_options(),
            ("show_thinking", Annotated[bool, typer.Option(
                "--show-thinking", help="Keep a thinking model's reasoning on screen (stderr), also when "
                "it is not a terminal.", rich_help_panel=THINKING)], False),
            ("hide_thinking", Annotated[bool, typer.Option(
                "--hide-thinking", help="No reasoning on stderr, also on a terminal (--json still has it).",
                rich_help_panel=THINKING)], False))


MEDIA = "Images and audio"


MMPROJ = ("mmproj", Annotated[str | None, typer.Option(
    "--mmproj", help="The model's multimodal projector (an mmproj-*.gguf file), which reads the images "
    "and audio. A Hub model's comes with it from its repository.", rich_help_panel=MEDIA,
    show_default=False, metavar="FILE")], None)
NO_MMPROJ = ("no_mmproj", Annotated[bool, typer.Option(
    "--no-mmproj", help="Do not fetch or load the Hub repository's projector.", rich_help_panel=MEDIA)],
    False)


MAX_MEDIA = ("max_media", Annotated[int, typer.Option(
    "--max-media", help="Images and audio files one prompt may hold.", rich_help_panel=MEDIA)], 8)


def media_options() -> tuple[tuple[str, Any, Any], ...]:
    """--image, --audio and --mmproj: media in the prompt, read by the model's projector."""
    return (
        ("image", Annotated[list[str] | None, typer.Option(
            "--image", help="An image file (PNG, JPEG, WebP, GIF, BMP) for the prompt; '-' reads it from "
            "stdin. Again for more. It goes where the prompt says <__media__>, else before the text.",
            rich_help_panel=MEDIA, show_default=False, metavar="PATH")], None),
        ("audio", Annotated[list[str] | None, typer.Option(
            "--audio", help="An audio file (WAV, MP3, FLAC) for the prompt, as --image.",
            rich_help_panel=MEDIA, show_default=False, metavar="PATH")], None),
        MMPROJ,
        NO_MMPROJ,
        MAX_MEDIA,
    )
