"""OpenAI's Responses API at the edge (issue 35): a /v1/responses body becomes the chat
request the rest of the server already serves (OpenAI's chat form, checked by `schema`),
with the settings the response object repeats and the conversation it continues
(`previous_response_id`, from the `response_store`). The reply's shapes are in
`responses_reply`; errors keep OpenAI's usual shape.

What maps to what:
- `input`: a string (one user message), or items: messages (`role` user, assistant, system
  or developer; `content` a string or `input_text` / `output_text` parts; images, files and
  audio are refused with a 400 naming the part), `function_call` items (consecutive ones
  join one assistant turn's tool calls), `function_call_output` items (tool messages) and
  `reasoning` items (their text becomes the next assistant turn's reasoning);
- `instructions` -> a system message first (not carried over by `previous_response_id`, as
  OpenAI documents); `previous_response_id` -> the stored conversation, then the new input;
- `max_output_tokens`, `temperature`, `top_p`, `stream`, llama-server's sampling extensions
  (`top_k`, `min_p`, `seed`, `stop`...) as chat takes them;
- `tools` (flat function tools: `name`, `description`, `parameters`; hosted tools such as
  web_search are refused), `tool_choice` (`auto`, `none`, `required`, `{"type": "function",
  "name"}`), `parallel_tool_calls`; `reasoning.effort` -> `reasoning_effort`;
  `text.format` (`text`, `json_object`, `json_schema`) -> `response_format`;
- `store` (default true), `metadata` (repeated in the response); `user`, `include`,
  `truncation`, `text.verbosity` and `reasoning.summary` are accepted and not used;
  `background`, `conversation` and `prompt` are refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infer.runtime.request_params import PARAMS
from infer.server.errors import ApiError, invalid, unsupported
from infer.server.response_store import ResponseStore, Stored

# llama-server's request fields, passed to the chat request as they are (`max_output_tokens`,
# the tools and the reasoning have a form of their own here).
_OWN_FORM = ("max_tokens", "tools", "tool_choice", "parallel_tool_calls")
_PASSED = ("stream", "parallel_tool_calls",
           *(name for p in PARAMS.values() if p.field not in _OWN_FORM for name in p.names("llama_server")))
_REFUSED = {"background": "background responses", "conversation": "the Conversations API",
            "prompt": "stored prompt templates"}
_EFFORT = {"none": "none", "minimal": "minimal", "low": "low", "medium": "medium", "high": "high",
           "xhigh": "high"}


@dataclass(frozen=True)
class Asked:
    """A Responses request: the chat request it is, and what its response keeps."""

    chat: dict[str, Any]  # the chat request (OpenAI's chat form)
    echo: dict[str, Any]  # the request's settings, as the response object repeats them
    messages: tuple[dict[str, Any], ...]  # this request's input as chat messages (no instructions)
    previous: Stored | None  # the stored response it continues
    store: bool


def not_found(response_id: str, param: str | None = None) -> ApiError:
    what = "previous_response_not_found" if param else "response_not_found"
    return ApiError(404, f"{param + ': ' if param else ''}no stored response {response_id!r} (infer serve "
                    "keeps the most recent ones in memory, until it stops)", param=param, code=what)


def request(body: dict[str, Any], store: ResponseStore) -> Asked:
    """The chat request a Responses body asks for, with the conversation it continues."""
    for name, what in _REFUSED.items():
        if body.get(name) not in (None, False):
            raise unsupported(name, what)
    previous = _previous(body.get("previous_response_id"), store)
    messages = tuple(_input(body.get("input")))
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise invalid("instructions", "instructions must be a string")
    history = previous.conversation() if previous is not None else []
    system = [{"role": "system", "content": instructions}] if instructions else []
    chat: dict[str, Any] = {"model": body.get("model"), "messages": [*system, *history, *messages]}
    chat.update((name, body[name]) for name in _PASSED if body.get(name) is not None)
    max_tokens = body.get("max_output_tokens")
    if max_tokens is not None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise invalid("max_output_tokens",
                          f"max_output_tokens must be a positive integer, not {max_tokens!r}")
        chat["max_tokens"] = max_tokens
    tools, choice = body.get("tools"), body.get("tool_choice")
    chat.update(_tools(tools))
    if choice is not None:
        chat["tool_choice"] = _tool_choice(choice)
    chat.update(_reasoning(body.get("reasoning")))
    chat.update(_text(body.get("text")))
    store_it = body.get("store", True)
    if not isinstance(store_it, bool):
        raise invalid("store", "store must be a boolean")
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise invalid("metadata", "metadata must be an object")
    echo = {"instructions": instructions, "max_output_tokens": max_tokens, "metadata": metadata or {},
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"),
            "reasoning": body.get("reasoning") or {"effort": None, "summary": None}, "store": store_it,
            "temperature": body.get("temperature"), "text": body.get("text") or {"format": {"type": "text"}},
            "tool_choice": choice if choice is not None else "auto", "tools": tools or [],
            "top_p": body.get("top_p"), "truncation": body.get("truncation") or "disabled",
            "user": body.get("user")}
    return Asked(chat, echo, messages, previous, store_it)


def _previous(value: Any, store: ResponseStore) -> Stored | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise invalid("previous_response_id", "previous_response_id must be a response's id")
    found = store.get(value)
    if found is None:
        raise not_found(value, "previous_response_id")
    return found


def _input(value: Any) -> list[dict[str, Any]]:
    """The input items as chat messages."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise invalid("input", "input must be a string or a non-empty array of items" if value is not None
                      else "input: Field required")
    out: list[dict[str, Any]] = []
    reasoning: str | None = None  # a reasoning item's text, for the next assistant turn
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise invalid(where, f"{where} must be an object")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "reasoning":
            reasoning = (reasoning or "") + _reasoning_text(item, where)
            continue
        if kind == "message":
            message = _message(item, where)
        elif kind == "function_call_output":
            message = _call_output(item, where)
        elif kind == "function_call":
            call = _call(item, where)
            if out and out[-1]["role"] == "assistant" and reasoning is None:  # (the same turn)
                out[-1].setdefault("tool_calls", []).append(call)
                continue
            message = {"role": "assistant", "content": "", "tool_calls": [call]}
        else:
            raise ApiError(400, f"{where}.type: an item of type {kind!r} is not supported by infer serve "
                           "(give messages, function_call, function_call_output and reasoning items)",
                           param=f"{where}.type", code="unsupported_parameter")
        if message["role"] == "assistant" and reasoning is not None:
            message["reasoning_content"], reasoning = reasoning, None
        out.append(message)
    return out


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise invalid(f"{where}.role", f"{where}.role must be user, assistant, system or developer")
    return {"role": "system" if role == "developer" else role,
            "content": _content(item.get("content"), f"{where}.content")}


def _content(value: Any, where: str) -> str | list[dict[str, Any]]:
    """A message's text; with images or audio, its parts in chat's form (image_url, input_audio)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise invalid(where, f"{where} must be a string or an array of content parts")
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(value):
        at = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_image", "input_audio"):
            parts.append(_medium(part, at))
            continue
        if kind == "input_file":
            raise ApiError(400, f"{at}: an input_file part is not supported by infer serve (give images as "
                           "input_image parts, text as input_text)", param=at, code="unsupported_parameter")
        text = part.get("refusal" if kind == "refusal" else "text") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text", "refusal") or not isinstance(text, str):
            raise invalid(at, f"{at} must be an input_text or output_text part with its text")
        parts.append({"type": "text", "text": text})
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _medium(part: dict[str, Any], at: str) -> dict[str, Any]:
    """An input_image part (image_url: a data: or http(s) URL) or input_audio part as chat's part,
    checked here (a bad one's 400 names this part, not the chat message it becomes)."""
    from infer.runtime.errors import FieldError
    from infer.runtime.media import part_medium

    if part["type"] == "input_audio":
        chat_part = {"type": "input_audio", "input_audio": part.get("input_audio")}
    elif part.get("file_id") is not None:
        raise ApiError(400, f"{at}.file_id: infer serve has no Files API: give the image as image_url (a "
                       "data: URL)", param=f"{at}.file_id", code="unsupported_parameter")
    elif not isinstance(part.get("image_url"), str):
        raise invalid(f"{at}.image_url", f"{at}.image_url must be the image's URL (a data: URL)")
    else:
        chat_part = {"type": "image_url", "image_url": {"url": part["image_url"]}}
    try:
        part_medium(chat_part, at)
    except FieldError as e:
        field = e.field.replace(".image_url.url", ".image_url")
        raise invalid(field, str(e).replace(e.field, field)) from None
    return chat_part


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    """A reasoning item's text (its content, else its summary; none if encrypted only)."""
    for name in ("content", "summary"):
        parts = item.get(name)
        if parts is None:
            continue
        if not isinstance(parts, list) or not all(isinstance(p, dict) for p in parts):
            raise invalid(f"{where}.{name}", f"{where}.{name} must be an array of parts")
        texts = [p["text"] for p in parts if isinstance(p.get("text"), str)]
        if texts:
            return "".join(texts)
    return ""


def _call(item: dict[str, Any], where: str) -> dict[str, Any]:
    for name in ("call_id", "name"):
        if not isinstance(item.get(name), str) or not item[name]:
            raise invalid(f"{where}.{name}", f"{where}.{name} must be a string")
    arguments = item.get("arguments", "{}")
    if not isinstance(arguments, str):
        raise invalid(f"{where}.arguments", f"{where}.arguments must be JSON text")
    return {"id": item["call_id"], "type": "function",
            "function": {"name": item["name"], "arguments": arguments}}


def _call_output(item: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(item.get("call_id"), str):
        raise invalid(f"{where}.call_id", f"{where}.call_id must be a string")
    output = item.get("output")
    if output is None:
        raise invalid(f"{where}.output", f"{where}.output: Field required")
    return {"role": "tool", "tool_call_id": item["call_id"], "content": _content(output, f"{where}.output")}


def _tools(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, list):
        raise invalid("tools", "tools must be an array")
    functions = []
    for j, tool in enumerate(value):
        at = f"tools[{j}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            if isinstance(kind, str):
                raise ApiError(400, f"{at}: the {kind!r} tool is not supported by infer serve (give "
                               "function tools: name, description, parameters)", param=at,
                               code="unsupported_parameter")
            raise invalid(at, f"{at} must be a tool with a type")
        if not isinstance(tool.get("name"), str):
            raise invalid(f"{at}.name", f"{at}.name must be a string")
        function = {"name": tool["name"], "parameters": tool.get("parameters") or {"type": "object"}}
        if tool.get("strict") is True:
            function["strict"] = True
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        functions.append({"type": "function", "function": function})
    return {"tools": functions} if functions else {}


def _tool_choice(value: Any) -> Any:
    if value in ("auto", "none", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("name"), str):
        return {"type": "function", "function": {"name": value["name"]}}
    raise invalid("tool_choice", 'tool_choice must be "auto", "none", "required" or {"type": "function", '
                  '"name": ...}')


def _reasoning(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid("reasoning", "reasoning must be an object")
    effort = value.get("effort")
    if effort is None:
        return {}
    if effort not in _EFFORT:
        raise invalid("reasoning.effort", f"reasoning.effort must be one of {', '.join(_EFFORT)}")
    return {"reasoning_effort": _EFFORT[effort]}


def _text(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid("text", "text must be an object")
    fmt = value.get("format")
    if fmt is None:
        return {}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"response_format": {"type": "json_object"}}
    if kind != "json_schema":
        raise invalid("text.format", 'text.format must be {"type": "text"}, {"type": "json_object"} or '
                      '{"type": "json_schema", "name": ..., "schema": {...}}')
    if not isinstance(fmt.get("schema"), dict):
        raise invalid("text.format.schema", "text.format.schema must be a JSON schema object")
    spec = {"name": fmt.get("name") or "reply", "schema": fmt["schema"], "strict": fmt.get("strict")}
    return {"response_format": {"type": "json_schema", "json_schema": spec}}
