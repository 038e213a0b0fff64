"""`infer run` through a running `infer serve`: the same output, with the model already loaded.

`--server URL` or `INFER_SERVER=URL` (``http://HOST:PORT``, ``unix:PATH`` for a Unix
socket, or ``unix`` alone for the socket every `infer serve` of this user listens on in
INFER_HOME) sends the request to that server instead of loading the model here. What the
command prints is unchanged: the text streamed to stdout, the same `--json` fields
(the server adds infer's own figures to its last chunk), the same exit codes. A server
that cannot be reached is exit 4, never a silent fall-back to loading the model here.
Flags that only make sense where the model is loaded (context, threads, devices,
speculation...) are the server's: given here, they are a usage error.

HTTP on a plain socket (cli/http1.py): nothing of llama.cpp, Jinja, an HTTP framework
or even the standard library's http.client is imported on this path.
"""

from __future__ import annotations

import json
import os
from urllib.parse import urlsplit

from infer.runtime.errors import InferError, ModelNotFoundError, NetworkError, ResourceError, UsageError

TYPE_CHECKING = False  # (typing and collections.abc cost the start-up of every call: cli/main.py)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping
    from typing import Any

SERVER_VARIABLE = "INFER_SERVER"
API_KEY_VARIABLE = "INFER_API_KEY"  # sent as `Authorization: Bearer KEY` (infer serve --api-key)
CONNECT_TIMEOUT_S = 10.0

# Flags whose work happens where the model is loaded: (flag name, how the user wrote it).
# Given with --server, they are refused (the server was started with its own).
SERVER_SIDE = {
    "ctx_size": "-c/--ctx-size", "batch_size": "-b/--batch-size", "ubatch_size": "-ub/--ubatch-size",
    "threads": "-t/--threads", "gpu_layers": "-ngl/--gpu-layers", "flash_attn": "-fa/--flash-attn",
    "cache_type_k": "-ctk/--cache-type-k", "cache_type_v": "-ctv/--cache-type-v", "no_mmap": "--no-mmap",
    "no_repack": "-nr/--no-repack",
    "tensor_split": "-ts/--tensor-split", "rpc": "--rpc", "explain": "--explain", "spec_type": "--spec-type",
    "model_draft": "-md/--model-draft", "spec_draft_n_max": "--spec-draft-n-max",
    "spec_draft_n_min": "--spec-draft-n-min", "draft_p_min": "--draft-p-min",
    "spec_ngram_size": "--spec-ngram-size",
    "chat_template_file": "--chat-template-file", "show_prompt": "--show-prompt", "no_cache": "--no-cache",
    "mmproj": "--mmproj", "no_mmproj": "--no-mmproj",
}

def address(flags: Mapping[str, Any]) -> Address | None:
    """The server to use: --server, else INFER_SERVER; None: load the model here. A malformed
    address is a usage error now, before any work."""
    given = flags.get("server") or os.environ.get(SERVER_VARIABLE, "").strip()
    return parse_address(given) if given else None


def refuse_local_flags(flags: Mapping[str, Any], defaults: Mapping[str, Any]) -> None:
    """A usage error naming the first flag given that only the server can honour: those of
    SERVER_SIDE, and the request parameters a request cannot carry (no name in the API)."""
    from infer.runtime.request_params import PARAMS

    local = {p.field: "/".join(p.flags) for p in PARAMS.values()
             if p.flags and p.group == "sampling" and not p.names("llama_server")}
    for name, spelled in {**SERVER_SIDE, **local}.items():
        if _given(flags, defaults, name):
            raise UsageError(f"{spelled} belongs where the model is loaded: give it to `infer serve`, not "
                             "to a command sent to a server (--server / INFER_SERVER)")


def _given(flags: Mapping[str, Any], defaults: Mapping[str, Any], name: str) -> bool:
    value, default = flags.get(name), defaults.get(name)
    return value != default and not (_empty(value) and _empty(default))


def request_fields(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The request's sampling fields from infer's SamplingParams overrides, each under its
    name in the API (OpenAI's, else llama-server's: runtime/request_params.py)."""
    from infer.runtime.request_params import SAMPLING

    out: dict[str, Any] = {}
    for name, value in overrides.items():
        if value is None:  # not set: the server's default
            continue
        param = SAMPLING.get(name)
        names = param.names("openai") + param.names("llama_server") if param else ()
        if not names:
            raise UsageError(f"the sampling setting {name} cannot be sent to a server")
        if name == "logit_bias":  # OpenAI's form; -100 bans a token as -inf does here
            out["logit_bias"] = {str(t): max(min(b, 100.0), -100.0) for t, b in value}
        elif name == "json_schema":  # llama-server's field: the schema itself
            try:
                out["json_schema"] = json.loads(value)
            except ValueError as e:
                raise UsageError(f"--json-schema is not valid JSON: {e}") from None
        else:
            out[names[0]] = list(value) if param.kind == "texts" else value
    return out


def thinking_fields(think: str | None, variables: Mapping[str, Any], budget: int | None) -> dict[str, Any]:
    """--think, --chat-template-kwargs and --reasoning-budget (checked: cli/flags.py) as the
    request's fields, under their names in infer serve's API (llama-server's)."""
    from infer.runtime.request_params import PARAMS

    values = {"think": think, "chat_template_kwargs": dict(variables) or None, "reasoning_budget": budget}
    return {PARAMS[field].names("llama_server")[0]: value for field, value in values.items()
            if value is not None}


def alias_system(model: str) -> str | None:
    """The system prompt an alias of models.toml gives, as a command applies it locally."""
    if "/" in model or "\\" in model or model.lower().endswith(".gguf"):  # a path or a Hub repo: no alias
        return None
    from infer.quant.catalog import load_catalog

    try:
        entry = load_catalog().get(model)  # (the catalog names every entry by each of its aliases)
    except InferError:
        return None
    return entry.system if entry is not None else None


def _empty(value: Any) -> bool:
    return value is None or value == [] or value == ()


class ContextTooLong(UsageError):
    """The server says the request does not fit its context (a chat may drop old exchanges)."""


class Address:
    """Where the server listens: HOST and PORT, or a Unix socket."""

    __slots__ = ("host", "port", "shown", "socket_path")

    def __init__(self, host: str, port: int, socket_path: str | None, shown: str) -> None:
        self.host = host
        self.port = port
        self.socket_path = socket_path  # a Unix socket instead of TCP
        self.shown = shown  # as the user wrote it, for messages


def parse_address(text: str) -> Address:
    """http://HOST:PORT (or HOST:PORT), unix:PATH, or unix alone: this user's own server's socket."""
    if text in ("unix", "unix:"):
        from infer.quant.paths import server_socket  # where `infer serve` also listens

        text = f"unix:{server_socket()}"
    if text.startswith("unix:"):
        return Address("localhost", 0, text[len("unix:"):], text)
    url = urlsplit(text if "://" in text else f"http://{text}")
    if url.scheme != "http" or not url.hostname:
        raise UsageError(f"{text!r} is not a server address: give http://HOST:PORT or unix:PATH")
    try:
        port = url.port or 80
    except ValueError:
        raise UsageError(f"{text!r}: the port is not a number") from None
    return Address(url.hostname, port, None, text)


def _open(addr: Address, method: str, path: str, body: Mapping[str, Any] | None) -> Any:
    """Send a request: the response (cli/http1.py), its status 200 (another status is raised
    as infer's error for it). Closing the response closes the connection."""
    from infer.cli import http1

    headers = {"Content-Type": "application/json", "Accept": "text/event-stream, application/json"}
    api_key = os.environ.get(API_KEY_VARIABLE, "").strip()
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    payload = json.dumps(body).encode() if body is not None else None
    try:
        sock = http1.connect(addr.host, addr.port, addr.socket_path, CONNECT_TIMEOUT_S)
    except OSError as e:
        raise _unreachable(addr, e) from None
    try:
        sock.settimeout(None)  # a long prompt may take a while before the first token
        try:
            response = http1.request(sock, method, path, payload, headers, host=addr.host)
        except (OSError, http1.ProtocolError) as e:
            raise _unreachable(addr, e) from None
        if response.status != 200:
            try:
                raw = response.read()
            except (OSError, http1.ProtocolError):
                raw = b""
            raise _error(response.status, raw, addr.shown)
    except BaseException:
        sock.close()
        raise
    return response


def _unreachable(addr: Address, e: BaseException) -> NetworkError:
    return NetworkError(f"cannot reach the infer server at {addr.shown} ({_reason(e)}); start one with "
                        f"`infer serve`, or unset {SERVER_VARIABLE} to run the model here")


def check(addr: Address) -> None:
    """Raise infer's error if the server cannot be reached or refuses this user (its API key)."""
    from infer.cli.http1 import ProtocolError

    response = _open(addr, "GET", "/v1/models", None)
    try:
        response.read()
    except (OSError, ProtocolError) as e:
        raise _unreachable(addr, e) from None
    finally:
        response.close()


def stream_events(addr: Address, path: str, body: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """POST `body` (with stream: true) and yield each server-sent event's JSON object until
    [DONE]. Closing the generator early closes the connection: the server then stops the
    request at its next step."""
    from infer.cli.http1 import ProtocolError

    response = _open(addr, "POST", path, body)
    try:
        try:
            for raw in response:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                yield json.loads(data)
        except (OSError, ProtocolError, ValueError) as e:
            raise NetworkError(f"the infer server at {addr.shown} went away mid-reply ({_reason(e)})"
                               ) from None
        raise NetworkError(f"the infer server at {addr.shown} ended the reply without [DONE]")
    finally:
        response.close()


def _reason(e: BaseException) -> str:
    return getattr(e, "strerror", None) or str(e) or type(e).__name__


def _error(status: int, raw: bytes, shown: str) -> InferError:
    """The server's error as infer's own, so that the exit code is the one the same mistake
    has without a server."""
    try:
        error = json.loads(raw)["error"]
        message, code = str(error.get("message")), error.get("code")
    except (ValueError, KeyError, TypeError, AttributeError):
        message, code = raw[:200].decode("utf-8", "replace").strip() or f"HTTP {status}", None
    if status == 404 and code == "model_not_found":
        return ModelNotFoundError(message)
    if status == 401:
        return NetworkError(f"the infer server at {shown} wants an API key: {message} "
                            f"(set {API_KEY_VARIABLE})")
    if code == "context_length_exceeded":
        return ContextTooLong(message)
    if status in (400, 413, 422):
        return UsageError(message)
    if status == 503:
        return ResourceError(f"the infer server at {shown} is busy: {message}")
    return NetworkError(f"the infer server at {shown} answered {status}: {message}")


def events(addr: Address, path: str, body: Mapping[str, Any]) -> Iterator[Any]:
    """Send one request (streamed): the reply's text as `Piece`s as it comes, then the reply
    as a `Completion`, with the server's own figures (its seed, finish reason, timings).
    Closing the generator early (Ctrl-C) closes the connection: the server stops the request."""
    from infer.runtime.results import Completion, Piece, Thought, Timings, Usage

    pieces: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []  # (OpenAI's tool calls, assembled from their pieces)
    usage: dict[str, Any] = {}
    ours: dict[str, Any] = {}
    finish = "length"
    stream = stream_events(addr, path, body)
    try:
        for event in stream:
            for choice in event.get("choices") or ():
                thought = choice["delta"].get("reasoning_content") if "delta" in choice else None
                if thought:
                    thoughts.append(thought)
                    yield Thought(thought)
                piece = choice["delta"].get("content") if "delta" in choice else choice.get("text")
                if piece:
                    pieces.append(piece)
                    yield Piece(piece)
                for call in (choice.get("delta") or {}).get("tool_calls") or ():
                    _add_call_piece(calls, call)
                if choice.get("finish_reason"):
                    finish = "eos" if choice["finish_reason"] == "stop" else choice["finish_reason"]
            usage = event.get("usage") or usage
            ours = event.get("infer") or ours
    finally:
        stream.close()
    t = ours.get("timings") or {}
    yield Completion(
        "".join(pieces), finish if finish == "tool_calls" else ours.get("finish_reason", finish),
        Usage(usage.get("prompt_tokens", 0),
              (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
              usage.get("completion_tokens", 0), ours.get("draft_tokens", 0), ours.get("accepted_tokens", 0)),
        Timings(0.0, t.get("prefill_ms", 0.0), t.get("decode_ms", 0.0), t.get("ttft_ms", 0.0),
                t.get("prefill_tokens", 0)),
        ours.get("seed"), reasoning="".join(thoughts) if "completion_tokens_details" in usage else None,
        reasoning_tokens=(usage.get("completion_tokens_details") or {}).get("reasoning_tokens", 0),
        tool_calls=calls or None)


def _add_call_piece(calls: list[dict[str, Any]], piece: Mapping[str, Any]) -> None:
    """A streamed `delta.tool_calls` item added to the calls: a new call (its id and name) or
    more of one's arguments."""
    index = piece.get("index", len(calls))
    while len(calls) <= index:
        calls.append({"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
    call, fn = calls[index], piece.get("function") or {}
    call["id"] = piece.get("id") or call["id"]
    call["function"]["name"] += fn.get("name") or ""
    call["function"]["arguments"] += fn.get("arguments") or ""


def generate(addr: Address, path: str, body: Mapping[str, Any], *,
             on_text: Callable[[str], None] | None = None,
             on_thought: Callable[[str], None] | None = None) -> Any:
    """Send one request (streamed); `on_text` sees the reply's text as it comes, `on_thought`
    a thinking model's reasoning. The reply as a `Completion` (see `events`)."""
    from infer.runtime.results import Piece, Thought

    replies = events(addr, path, body)
    try:
        for event in replies:
            if not isinstance(event, (Piece, Thought)):
                return event
            seen = on_text if isinstance(event, Piece) else on_thought
            if seen is not None:
                seen(event.text)
    finally:
        replies.close()
    raise AssertionError("events() ends with a Completion")
