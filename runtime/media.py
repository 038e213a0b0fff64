"""Images and audio in a prompt (issue 36): the files as infer takes them, and a prompt's
tokens with its media in them.

A prompt with media is rendered as text with libmtmd's marker (``<__media__>``) where each
medium goes, then split by the projector into text and media chunks (runtime/llama/projector).
Its token list holds each medium as a run of one pseudo-token (a negative id made from the
medium's SHA-256) as long as the medium's embeddings: the KV cache's prefix reuse then works
as for text (the same image at the same place is the same run; another image differs), and
`spans` tells the prefill where a medium must be evaluated instead of decoded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from infer.runtime.errors import MediaError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from infer.runtime.llama import Chunk, Projector

MARKER = "<__media__>"  # libmtmd's default marker (mtmd_default_marker)
MAX_MEDIA = 8  # images and audio in one prompt at most, unless --max-media says otherwise
MAX_IMAGE_BYTES = 20 << 20  # as OpenAI's image inputs
MAX_AUDIO_BYTES = 50 << 20

# The formats libmtmd decodes (stb_image and miniaudio), by their first bytes.
_IMAGE_MAGIC = ((b"\x89PNG\r\n\x1a\n", "PNG"), (b"\xff\xd8\xff", "JPEG"), (b"GIF87a", "GIF"),
                (b"GIF89a", "GIF"), (b"BM", "BMP"))
_AUDIO_MAGIC = ((b"fLaC", "FLAC"), (b"ID3", "MP3"), (b"\xff\xfb", "MP3"), (b"\xff\xf3", "MP3"),
                (b"\xff\xf2", "MP3"))


@dataclass(frozen=True)
class Medium:
    """One image or audio file: its name (for messages), kind and bytes."""

    name: str
    kind: str  # "image" or "audio"
    data: bytes
    url: str | None = None  # an http(s) image not fetched yet (infer serve --allow-remote-media)


def sniff(data: bytes) -> tuple[str, str] | None:
    """(kind, format) of a file's bytes, or None for one infer does not take."""
    if data[:4] == b"RIFF" and data[8:12] in (b"WEBP", b"WAVE"):
        return ("image", "WebP") if data[8:12] == b"WEBP" else ("audio", "WAV")
    for magic, name in _IMAGE_MAGIC:
        if data.startswith(magic):
            return "image", name
    for magic, name in _AUDIO_MAGIC:
        if data.startswith(magic):
            return "audio", name
    return None


def medium(name: str, data: bytes, kind: str | None = None) -> Medium:
    """A checked medium: not empty, of a format libmtmd decodes (of `kind` where given), not
    larger than the limits. A MediaError naming the file otherwise."""
    if not data:
        raise MediaError(f"{name}: the file is empty")
    found = sniff(data)
    if found is None:
        raise MediaError(f"{name}: not a PNG, JPEG, WebP, GIF or BMP image, nor WAV, MP3 or FLAC audio")
    if kind is not None and found[0] != kind:
        raise MediaError(f"{name}: a {found[1]} file is {found[0]}, not {kind}")
    limit = MAX_IMAGE_BYTES if found[0] == "image" else MAX_AUDIO_BYTES
    if len(data) > limit:
        raise MediaError(f"{name}: {len(data):,} bytes, over the limit of {limit:,} for {found[0]}")
    return Medium(name, found[0], data)


def part_medium(part: dict, where: str) -> Medium:
    """An OpenAI content part's medium: `image_url` with a `data:` URL (base64) or an http(s) URL
    (a Medium to fetch: its `url`), or `input_audio` ({"data": base64, "format": "wav"|"mp3"|"flac"});
    a FieldError names a bad part."""
    import base64
    import binascii

    from infer.runtime.errors import FieldError

    if part["type"] == "image_url":
        spec = part.get("image_url")
        url = spec.get("url") if isinstance(spec, dict) else spec
        if not isinstance(url, str):
            raise FieldError(f"{where}.image_url.url", f"{where}.image_url.url must be a string")
        if url.startswith(("http://", "https://")):
            return Medium(f"{where}.image_url.url", "image", b"", url=url)
        head, comma, data = url.partition(",")
        if not (url.startswith("data:") and comma and head.endswith(";base64")):
            raise FieldError(f"{where}.image_url.url", f"{where}.image_url.url must be a data: URL "
                             "(data:image/png;base64,...) or an http(s) URL")
        kind, field_name = "image", f"{where}.image_url.url"
    else:
        spec = part.get("input_audio")
        data = spec.get("data") if isinstance(spec, dict) else None
        if not isinstance(data, str):
            raise FieldError(f"{where}.input_audio.data", f"{where}.input_audio.data must be base64 text")
        kind, field_name = "audio", f"{where}.input_audio.data"
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise FieldError(field_name, f"{field_name}: not valid base64") from None
    try:
        return medium(field_name, raw, kind)
    except MediaError as e:
        raise FieldError(field_name, str(e)) from None


def read_medium(path: str, kind: str | None = None, *, stdin: bytes | None = None) -> Medium:
    """The file at `path` (`-`: `stdin`'s bytes) as a checked medium."""
    if path == "-":
        return medium("stdin", stdin or b"", kind)
    p = Path(path)
    limit = MAX_AUDIO_BYTES if kind == "audio" else MAX_IMAGE_BYTES
    try:
        if p.stat().st_size > max(MAX_IMAGE_BYTES, MAX_AUDIO_BYTES, limit):
            raise MediaError(f"{path}: {p.stat().st_size:,} bytes, over the limit of {limit:,}")
        data = p.read_bytes()
    except IsADirectoryError:
        raise MediaError(f"{path}: is a folder, not a file") from None
    except FileNotFoundError:
        raise MediaError(f"{path}: no such file") from None
    except OSError as e:
        raise MediaError(f"{path}: cannot read it: {e.strerror or e}") from None
    return medium(path, data, kind)


def place_markers(text: str, count: int) -> str:
    """`text` with one marker per medium: as the user placed them, or all just before the text
    (llama.cpp's convention: llama-mtmd-cli's, llama-server's)."""
    have = text.count(MARKER)
    if have == count:
        return text
    if have:
        raise MediaError(f"the prompt has {have} media markers ({MARKER}) for {count} media")
    return MARKER * count + text


def pseudo_token(digest: str, part: int = 0) -> int:
    """The negative id that stands for each position of a medium's `part`-th chunk in a token
    list (a model that cuts an image into tiles, as SmolVLM's, gives one chunk per tile)."""
    import hashlib

    return -2 - int.from_bytes(hashlib.sha256(f"{digest}:{part}".encode()).digest()[:4], "big") % (1 << 30)


@dataclass
class MediaPrompt:
    """A prompt's tokens with its media as runs of pseudo-tokens, and the chunks to evaluate
    for them (by pseudo-token). Close it when its generation is done (libmtmd's chunks)."""

    projector: Projector
    tokens: list[int]
    media: dict[int, Chunk] = field(default_factory=dict)
    free: Callable[[], None] = lambda: None

    def close(self) -> None:
        self.media.clear()
        self.free()
        self.free = lambda: None

    def __del__(self) -> None:  # (a server's requests share one: freed with the last of them)
        with contextlib.suppress(Exception):  # (at exit, or a half-made one)
            self.close()

    def __enter__(self) -> MediaPrompt:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def media_prompt(projector: Projector, text: str, media: Sequence[Medium], *,
                 add_special: bool, limit: int | None = MAX_MEDIA) -> MediaPrompt:
    """Split `text` (its markers in place) and `media` into a MediaPrompt; more media than
    `limit` (None: no limit) is a MediaError."""
    if limit is not None and len(media) > limit:
        raise MediaError(f"{len(media)} images and audio files, over the limit of {limit} a prompt "
                         "may hold (--max-media)")
    for m in media:
        if m.url is not None:
            raise MediaError(f"{m.name}: {m.url} is a remote image: only infer serve fetches those, when "
                             "started with --allow-remote-media; give the file or a data: URL")
        if not {"image": projector.vision, "audio": projector.audio}[m.kind]:
            raise MediaError(f"{m.name}: this model's projector takes no {m.kind}")
    chunks, free = projector.chunks(text, [(m.name, m.data) for m in media], add_special=add_special)
    out = MediaPrompt(projector, [], free=free)
    parts: dict[str, int] = {}  # chunks of each medium so far
    reader = getattr(projector, "identity", "")
    for chunk in chunks:
        if chunk.kind == "text":
            out.tokens.extend(chunk.tokens)
        else:  # (another projector reads the same image into other embeddings: other tokens)
            token = pseudo_token(reader + chunk.digest, parts.get(chunk.digest, 0))
            parts[chunk.digest] = parts.get(chunk.digest, 0) + 1
            out.media[token] = chunk
            out.tokens.extend([token] * chunk.n_tokens)
    return out


def run_start(tokens: Sequence[int], i: int) -> int:
    """`i`, or where the medium's run that holds position i begins."""
    while 0 < i < len(tokens) and tokens[i] < 0 and tokens[i - 1] == tokens[i]:
        i -= 1
    return i


def spans(tokens: Sequence[int], start: int, stop: int, n_batch: int,
          media: dict[int, Chunk]) -> Iterator[tuple[int, int, Chunk | None]]:
    """(begin, end, medium) pieces of tokens[start:stop] in prefill order: text in batches of at
    most n_batch (medium None), each medium whole (`start` and `stop` at a run's edges)."""
    i = start
    while i < stop:
        if tokens[i] < 0:
            chunk = media.get(tokens[i])
            if chunk is None:
                raise MediaError("a medium of the cached prompt is no longer at hand")  # (a bug)
            yield i, i + chunk.n_tokens, chunk
            i += chunk.n_tokens
        else:
            j = i
            while j < stop and j - i < n_batch and tokens[j] >= 0:
                j += 1
            yield i, j, None
            i = j


def media_of(messages: Sequence[dict]) -> list[Medium]:
    """The media of a chat's messages, in order (each message's "media", as its markers)."""
    return [m for message in messages for m in message.get("media", ())]


def text_only(messages: Sequence[dict]) -> list[dict]:
    """The messages as a chat template sees them: without their media (their markers stay in
    the content)."""
    return [{k: v for k, v in m.items() if k != "media"} if "media" in m else dict(m) for m in messages]


def openai_message(message: dict) -> dict:
    """A message with media as an OpenAI chat message: its content as parts, each medium an
    `image_url` (a data: URL) or `input_audio` part at its marker (for a request to a server)."""
    if "media" not in message:
        return message
    import base64

    parts: list[dict] = []
    pieces = str(message.get("content") or "").split(MARKER)
    for i, text in enumerate(pieces):
        if text:
            parts.append({"type": "text", "text": text})
        if i < len(message["media"]):
            m = message["media"][i]
            data = base64.b64encode(m.data).decode()
            found = sniff(m.data)
            fmt = found[1].lower() if found else "png"
            if m.kind == "image":
                parts.append({"type": "image_url", "image_url": {"url": f"data:image/{fmt};base64,{data}"}})
            else:
                parts.append({"type": "input_audio", "input_audio": {"data": data, "format": fmt}})
    return {**{k: v for k, v in message.items() if k != "media"}, "content": parts}
