"""The one place where a request body becomes typed values, or an OpenAI-shaped 400.

Fields OpenAI defines are checked against its types and ranges; infer's other
sampling parameters are accepted as extensions under llama-server's names. Fields
infer cannot honour (images, audio...) are refused naming the field, never
silently ignored; fields it does not know are ignored, as clients send extras.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any

from infer.runtime.chat_messages import chat_messages
from infer.runtime.errors import FieldError
from infer.runtime.json_schema import unsupported_keywords
from infer.runtime.request_params import PARAMS, SAMPLING, Param, out_of_range
from infer.runtime.thinking_prompt import ThinkingRequest
from infer.runtime.tool_request import ToolRequest, parse_tools
from infer.server.errors import ApiError, invalid, unsupported

MAX_BODY_BYTES = 8 * 1024 * 1024  # a request body larger than this is refused (413)
MAX_N = 16  # choices per request
MAX_STOP = 16
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class Infill:
    """A fill-in-the-middle request (runtime/infill.py): the text before and after the gap,
    other files for context (name, text), and what was typed after the prefix so far."""

    prefix: str
    suffix: str
    extra: tuple[tuple[str, str], ...] = ()
    prompt: str = ""


@dataclass(frozen=True)
class Generation:
    """What a client asked for, checked."""

    chat: bool  # /v1/chat/completions (messages) or /v1/completions (prompt)
    model: str | None
    messages: tuple[dict[str, Any], ...] = ()  # role, content (an assistant's reasoning, calls; results)
    prompt: str | tuple[int, ...] = ""
    stream: bool = False
    include_usage: bool = False
    n: int = 1
    logprobs: int | None = None  # None: no logprobs; k: each token's and the k likeliest
    sampling: tuple[tuple[str, Any], ...] = ()  # SamplingParams fields the request sets
    return_tokens: bool = False  # llama-server's extension: the generated token ids in each choice
    thinking: ThinkingRequest = field(default_factory=ThinkingRequest)  # a thinking model's settings
    tools: ToolRequest = field(default_factory=ToolRequest)  # tools the reply may call
    infill: Infill | None = None  # fill in the middle (a completion's `suffix`, or llama-server's /infill)
    # max_tokens only caps the reply, which may end where the context does (Anthropic's clients
    # send one far above a local model's context: Claude Code's 32,000); else it must fit
    max_tokens_caps: bool = False

    @property
    def overrides(self) -> dict[str, Any]:
        return dict(self.sampling)


def parse_body(raw: bytes) -> dict[str, Any]:
    """The JSON object of a request body (no NaN or Infinity: they are not JSON)."""
    if len(raw) > MAX_BODY_BYTES:
        raise ApiError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes", code="body_too_large")

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not valid JSON")

    try:
        body = json.loads(raw, parse_constant=no_constant)
    except (ValueError, RecursionError) as e:
        raise invalid(None, f"the body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise invalid(None, f"the body must be a JSON object, not {_kind(body)}", code="invalid_json")
    return body


# Refused: what infer cannot do. (name -> what it is, for the message)
_UNSUPPORTED = {
    "audio": "audio output", "prediction": "predicted outputs", "web_search_options": "web search",
    "echo": "echoing the prompt",
}

# The request parameters a body may set, under their OpenAI and llama-server names
# (runtime/request_params.py's table), a number checked by the rule its flag is checked by.
# Those with a form of their own in the API are read by the functions below.
_OWN_FORM = ("max_tokens", "stop", "logit_bias", "json_schema")
_REQUEST_PARAMS = tuple((p, tuple(dict.fromkeys(p.names("openai") + p.names("llama_server"))))
                        for p in SAMPLING.values() if p.field not in _OWN_FORM)
_TYPES = {"bool": bool, "text": str}


def parse_generation(body: dict[str, Any], *, chat: bool) -> Generation:
    """Check a /v1/chat/completions (`chat`) or /v1/completions body."""
    try:
        return _generation(body, chat=chat)
    except FieldError as e:  # (the library's checks of a field: runtime/tool_request.py)
        raise ApiError(400, str(e), param=e.field, code="unsupported_parameter" if e.unsupported else None) \
            from None


def _generation(body: dict[str, Any], *, chat: bool) -> Generation:
    for name, what in _UNSUPPORTED.items():
        if _given(body.get(name)) and not (name == "echo" and body[name] is False):
            raise unsupported(name, what)
    if chat:
        modalities = body.get("modalities")
        if modalities is not None and modalities != ["text"]:
            raise unsupported("modalities", "output other than text")
    model = _optional(body, "model", str)
    stream = bool(_optional(body, "stream", bool) or False)
    include_usage = False
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise invalid("stream_options", "stream_options must be an object")
        if not stream:
            raise invalid("stream_options", "stream_options is only allowed with stream: true")
        include_usage = bool(_optional(options, "include_usage", bool, where="stream_options.include_usage"))
    n = _number(body, "n", int, 1, MAX_N)
    best_of = _number(body, "best_of", int, 1, MAX_N)
    if best_of is not None and best_of != (n or 1):
        raise unsupported("best_of", "best_of other than n")
    sampling: dict[str, Any] = {}
    for param, names in _REQUEST_PARAMS:
        value = _request_value(body, param, names)
        if value is not None:
            sampling[param.field] = value
    max_tokens = _max_tokens(body)
    if max_tokens is not None:
        sampling["max_tokens"] = max_tokens
    stop = _stop(body.get("stop"))
    if stop:
        sampling["stop"] = stop
    bias = _logit_bias(body.get("logit_bias"))
    if bias:
        sampling["logit_bias"] = bias
    schema = _response_format(body)
    if schema is not None:
        if "grammar" in sampling:
            raise invalid("grammar", "give either grammar or response_format, not both")
        sampling["json_schema"] = schema
    logprobs = _chat_logprobs(body) if chat else _number(body, "logprobs", int, 0, 5)
    common: dict[str, Any] = {"model": model, "stream": stream, "include_usage": include_usage, "n": n or 1,
                              "logprobs": logprobs, "sampling": tuple(sampling.items()),
                              "return_tokens": bool(_optional(body, "return_tokens", bool))}
    thinking = _thinking(body)
    if chat:
        return Generation(chat=True, messages=chat_messages(body.get("messages")), thinking=thinking,
                          tools=parse_tools(body), **common)
    return _completion(body, thinking, common)


def _completion(body: dict[str, Any], thinking: ThinkingRequest, common: dict[str, Any]) -> Generation:
    """A /v1/completions body's own part: its prompt, and a suffix to fill in before."""
    for name in ("tools", "tool_choice"):
        if body.get(name) is not None:
            raise invalid(name, f"{name} applies to chat completions")
    if thinking != ThinkingRequest():
        name = next(n for n in _THINKING_NAMES if body.get(n) is not None)
        raise invalid(name, f"{name} applies to chat completions, whose chat template renders the prompt")
    prompt = _prompt(body.get("prompt"))
    suffix = body.get("suffix")
    if suffix is None:
        return Generation(chat=False, prompt=prompt, **common)
    if not isinstance(suffix, str) or not isinstance(prompt, str):
        raise invalid("suffix", "suffix must be a string, with a prompt that is a string")
    return Generation(chat=False, prompt=prompt, infill=Infill(prompt, suffix), **common)


def parse_infill(body: dict[str, Any]) -> Generation:
    """llama-server's /infill body: `input_prefix`, `input_suffix`, `input_extra` (files as
    {"filename", "text"}), `prompt` (typed after the prefix), and a completion's fields."""
    parts = {}
    for name in ("input_prefix", "input_suffix", "prompt"):
        value = body.get(name, "")
        if not isinstance(value, str):
            raise invalid(name, f"{name} must be a string")
        parts[name] = value
    extra = body.get("input_extra", [])
    if not isinstance(extra, list) or not all(
            isinstance(c, dict) and isinstance(c.get("text"), str) and isinstance(c.get("filename", ""), str)
            for c in extra):
        raise invalid("input_extra", 'input_extra must be an array of {"filename": string, "text": string}')
    own = ("input_prefix", "input_suffix", "input_extra", "prompt")
    rest = {k: v for k, v in body.items() if k not in own}
    gen = parse_generation({**rest, "prompt": ""}, chat=False)
    files = tuple((c.get("filename", "tmp") or "tmp", c["text"]) for c in extra)
    return replace(gen, prompt=parts["input_prefix"],
                   infill=Infill(parts["input_prefix"], parts["input_suffix"], files, parts["prompt"]))


_EFFORT = {"none": "off", "minimal": "low", "low": "low", "medium": "medium", "high": "high"}  # OpenAI's
_THINKING_NAMES = tuple(name for p in PARAMS.values() if p.group in ("prompt", "reply")
                        for name in p.names("openai") + p.names("llama_server"))


def _thinking(body: dict[str, Any]) -> ThinkingRequest:
    """A thinking model's settings: `think` (true, false or a level: Ollama's), OpenAI's
    `reasoning_effort`, `chat_template_kwargs`, `reasoning_budget` and `reasoning_format`."""
    think = body.get("think")
    levels = PARAMS["think"].choices
    if isinstance(think, bool):
        think = "on" if think else "off"
    elif think is not None and think not in levels:
        raise invalid("think", f"think must be true, false or one of {', '.join(levels)}")
    effort = body.get("reasoning_effort")
    if effort is not None:
        if effort not in _EFFORT:
            raise invalid("reasoning_effort", f"reasoning_effort must be one of {', '.join(_EFFORT)}")
        if think is not None and think != _EFFORT[effort]:
            raise invalid("reasoning_effort", "give either think or reasoning_effort, not both")
        think = _EFFORT[effort]
    variables = body.get("chat_template_kwargs")
    if variables is not None and not isinstance(variables, dict):
        raise invalid("chat_template_kwargs", "chat_template_kwargs must be an object")
    budget = _request_value(body, PARAMS["reasoning_budget"], ("reasoning_budget",))
    shape = _optional(body, "reasoning_format", str)
    if shape is not None and shape not in PARAMS["reasoning_format"].choices:
        raise invalid("reasoning_format", "reasoning_format must be one of "
                      f"{', '.join(PARAMS['reasoning_format'].choices)}")
    return ThinkingRequest(think, variables or {}, budget, shape != "none")


def _given(value: Any) -> bool:
    return value is not None and value != [] and value != {}


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")


def _optional(body: dict[str, Any], name: str, kind: type, *, where: str | None = None) -> Any:
    value = body.get(name)
    if value is None:
        return None
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if not ok:
        raise invalid(where or name, f"{where or name} must be {_kind(kind())}, not {_kind(value)}")
    return value


def _number(body: dict[str, Any], name: str, kind: type, low: float | None, high: float | None) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid(name, f"{name} must be a number, not {_kind(value)}")
    if kind is int:
        if isinstance(value, float) and not value.is_integer():
            raise invalid(name, f"{name} must be an integer, got {value}")
        value = int(value)
    else:
        value = float(value)
        if not math.isfinite(value):
            raise invalid(name, f"{name} must be finite")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise invalid(name, f"{name} must be {bounds}, got {value}")
    return value


def _request_value(body: dict[str, Any], param: Param, names: tuple[str, ...]) -> Any:
    """A request parameter's value under the first of its `names` the body gives, a number
    checked by the rule flags are checked by; None if none is given."""
    for name in names:
        if not param.numeric:
            value = _optional(body, name, _TYPES[param.kind])
        else:
            value = _number(body, name, int if param.kind == "int" else float, None, None)
            problem = None if value is None else out_of_range(param.field, value, name)
            if problem is not None:
                raise invalid(name, problem)
        if value is not None:
            return value
    return None


def _max_tokens(body: dict[str, Any]) -> int | None:
    names = SAMPLING["max_tokens"].names("openai") + SAMPLING["max_tokens"].names("llama_server")
    values = [v for v in (_number(body, name, int, 1, None) for name in names) if v is not None]
    return values[0] if values else None


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise invalid("stop", "stop must be a string or an array of strings")
    if len(stops) > MAX_STOP:
        raise invalid("stop", f"stop takes at most {MAX_STOP} strings")
    return tuple(s for s in stops if s)


def _logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise invalid("logit_bias", "logit_bias must be an object of token ids and biases")
    out = []
    for key, bias in value.items():
        try:
            token = int(key)
        except ValueError:
            raise invalid("logit_bias", f"logit_bias: {key!r} is not a token id") from None
        if token < 0:
            raise invalid("logit_bias", f"logit_bias: {key!r} is not a token id")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise invalid("logit_bias", f"logit_bias[{key}] must be a number between -100 and 100")
        out.append((token, float(bias)))
    return tuple(out)


def _response_format(body: dict[str, Any]) -> str | None:
    """The JSON schema the reply must follow (as JSON text), if any."""
    fmt = body.get("response_format")
    if fmt is None:
        schema = body.get("json_schema")  # llama-server's extension
        if schema is None:
            return None
        if not isinstance(schema, dict):
            raise invalid("json_schema", "json_schema must be an object")
        return json.dumps(schema)
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise invalid("response_format", "response_format must be an object with a type")
    kind = fmt["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return json.dumps({"type": "object"})
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise invalid("response_format.json_schema", "response_format.json_schema must be an object")
        schema = spec.get("schema", {})
        if not isinstance(schema, (dict, bool)):
            raise invalid("response_format.json_schema.schema", "the schema must be a JSON object")
        unsupported = unsupported_keywords(schema)
        if unsupported:
            raise invalid("response_format.json_schema.schema", f"unsupported JSON schema keyword(s) "
                          f"{', '.join(unsupported)}: the reply could not be held to the schema")
        return json.dumps(schema)
    raise invalid("response_format.type", f"response_format.type {kind!r} is not text, json_object or "
                  "json_schema")


def _chat_logprobs(body: dict[str, Any]) -> int | None:
    wanted = _optional(body, "logprobs", bool)
    top = _number(body, "top_logprobs", int, 0, MAX_TOP_LOGPROBS)
    if top is not None and not wanted:
        raise invalid("top_logprobs", "top_logprobs needs logprobs: true")
    return (top or 0) if wanted else None


def _prompt(value: Any) -> str | tuple[int, ...]:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        return value[0]
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                 for t in value):
        return tuple(value)
    if isinstance(value, list) and len(value) > 1 and all(isinstance(t, str) for t in value):
        raise unsupported("prompt", "more than one prompt per request")
    raise invalid("prompt", "prompt must be a string or an array of token ids")
