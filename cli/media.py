"""Images and audio from the command line (--image, --audio, --mmproj): the files read and
checked before the model loads, the projector opened beside the model (infer run, infer chat),
the media put in the prompt."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, BinaryIO

from infer.runtime.errors import MediaError, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from infer.runtime.media import MediaPrompt, Medium


def projector_path(flags: Mapping[str, Any], resolved: Any) -> str | None:
    """--mmproj's file, else the projector that came with the model from its repository."""
    if flags.get("mmproj"):
        return str(flags["mmproj"])
    return str(resolved.mmproj) if resolved.mmproj is not None and not flags.get("no_mmproj") else None


def prompt_and_media(flags: Mapping[str, Any], prompt_arg: str | None,
                     resolved: Any) -> tuple[str, str, list[Medium], str | None]:
    """The prompt with a marker where each medium goes, the prompt as typed, the media, and the
    projector file that reads them (an error where there are media and no projector)."""
    projector = projector_path(flags, resolved)
    text, asked, media = media_and_prompt(flags, prompt_arg)
    if media and projector is None:
        raise MediaError(f"{media[0].name}: reading {media[0].kind} needs the model's projector: "
                         "give --mmproj FILE (its mmproj-*.gguf)")
    return text, asked, media, projector


def media_and_prompt(flags: Mapping[str, Any], prompt_arg: str | None) -> tuple[str, str, list[Medium]]:
    """The --image and --audio files, checked (--max-media too), and the prompt: with a marker
    where each medium goes, and as typed (stdin is the prompt's unless a medium reads it)."""
    import sys

    from infer.cli.stdin import combine_prompt
    from infer.runtime.media import place_markers

    media = read_media(flags, sys.stdin.buffer, sys.stdin.isatty())
    if len(media) > flags.get("max_media", len(media)):
        raise MediaError(f"{len(media)} images and audio files, over --max-media {flags['max_media']}")
    stdin_read = "-" in [*(flags.get("image") or ()), *(flags.get("audio") or ())]  # (not the prompt's)
    asked = combine_prompt(prompt_arg, sys.stdin.buffer, sys.stdin.isatty() or stdin_read)
    return (place_markers(asked, len(media)) if media else asked), asked, media


def read_media(flags: Mapping[str, Any], stdin: BinaryIO, stdin_is_tty: bool) -> list[Medium]:
    """The --image and --audio files (images first), checked; `-` reads one from stdin."""
    from infer.runtime.media import read_medium

    paths = [(p, kind) for kind in ("image", "audio") for p in flags.get(kind) or []]
    piped = None
    if any(p == "-" for p, _ in paths):
        if sum(p == "-" for p, _ in paths) > 1:
            raise UsageError("only one --image or --audio can read standard input ('-')")
        if stdin_is_tty:
            raise UsageError("--image - reads standard input, but standard input is a terminal")
        piped = stdin.read()
    return [read_medium(p, kind, stdin=piped) for p, kind in paths]


def open_projector(path: str, session: Any) -> Any:
    """The projector at `path` for the session's model, on the same devices and with the same
    flash attention."""
    from infer.runtime.llama import Projector

    projector = Projector(path, session.model, n_threads=session.context.n_threads,
                          use_gpu=session.model.local_gpu, flash_attn=session.context.flash_attn)
    if projector.mrope:
        projector.close()
        raise MediaError(f"{path}: this projector places media with M-RoPE (Qwen2-VL and its "
                         "successors), which infer does not read yet")
    return projector


@contextmanager
def projector_for(path: str | None, session: Any, media: list[Medium]) -> Iterator[Any]:
    """The projector at `path` loaded for the session's model (None without media), closed
    after."""
    if not media or path is None:
        yield None
        return
    projector = open_projector(path, session)
    try:
        yield projector
    finally:
        projector.close()


def with_media(projector: Any, model: Any, prompt: Any, tokens: list[int], media: list[Medium],
               record: Any, asked: str) -> tuple[list[int], MediaPrompt]:
    """The prompt's tokens with its media in place of their markers (the rendered `prompt`'s
    text split by the projector; what the thinking plan added after it kept). The saved
    conversation (`record`) keeps the message as typed: --continue has no media."""
    from infer.runtime.media import media_prompt
    from infer.runtime.prompt import adds_bos

    mp = media_prompt(projector, prompt.text, media, add_special=adds_bos(model, prompt.text),
                      limit=None)  # (--max-media was checked before the model loaded)
    if record is not None:
        record.messages[-1]["content"] = asked
    return mp.tokens + tokens[len(prompt.tokens):], mp
