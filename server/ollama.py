"""Ollama's native API at the edge (issue 35): /api/chat and /api/generate bodies become the
chat (or, `raw`, completion) request the rest of the server serves, checked by `schema`;
errors take Ollama's shape, `{"error": "..."}`. The replies' shapes are in `ollama_reply`,
the model listings (/api/tags, /api/show, /api/ps, /api/version) in `ollama_models`.

What maps to what:
- `messages` (roles, `content`, an assistant's `thinking` and `tool_calls` with arguments as
  objects, `role: "tool"` results, matched to the calls before them by order or `tool_name`);
  a user message's `images` (base64) -> image_url parts before its text;
- /api/generate: `prompt` and `system` as a chat of one turn, or `raw: true` as the prompt
  exactly (no template); `template` and `suffix` refused (infer renders the model's own
  template; fill-in-the-middle is not there yet), `context` refused (Ollama's deprecated token
  context; send the conversation as messages);
- `format` (`"json"` or a JSON schema), `think` (true, false or a level), `tools` (and OpenAI's
  `tool_choice` and `parallel_tool_calls`, which Ollama ignores), `stream` (on unless false, as
  Ollama's default);
- `options`: `temperature`, `top_k`, `top_p`, `min_p`, `typical_p`, `repeat_penalty`,
  `repeat_last_n`, `presence_penalty`, `frequency_penalty`, `seed`, `stop`, `mirostat*`, and
  `num_predict` (the token limit; negative: none); `num_ctx` and the loading options
  (`num_gpu`, `num_thread`, ...) do not change a running model and are ignored, as is
  `keep_alive` (the server's --keep-alive applies).
"""

from __future__ import annotations

import json
from typing import Any

from infer.server.errors import ApiError, invalid

# Ollama's option -> the chat body's field (llama-server's names, which `schema` reads).
_OPTIONS = {name: name for name in ("temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty",
                                    "repeat_last_n", "presence_penalty", "frequency_penalty", "seed",
                                    "mirostat", "mirostat_tau", "mirostat_eta")}


def error_body(error: ApiError) -> dict[str, Any]:
    return {"error": error.message}


def chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """The chat request an /api/chat body asks for."""
    return {**_common(body), "messages": _messages(body.get("messages"))}


def generate_body(body: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    """Whether an /api/generate body is a chat (else a raw completion), and its request."""
    for name, why in (("template", "infer renders the model's own chat template (raw: true sends the "
                                   "prompt as it is)"),
                      ("suffix", "fill-in-the-middle is not supported yet"),
                      ("context", "the token context of an earlier reply is not supported (send the "
                                  "conversation to /api/chat)")):
        if body.get(name) not in (None, "", []):
            raise ApiError(400, f"{name}: {why}", param=name, code="unsupported_parameter")
    prompt = body.get("prompt", "")
    if not isinstance(prompt, str):
        raise invalid("prompt", "prompt must be a string")
    if body.get("raw") is True:
        if body.get("think") not in (None, False):
            raise invalid("think", "think needs the chat template: not with raw")
        return False, {**_common(body), "prompt": prompt}
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        raise invalid("system", "system must be a string")
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": _with_images(prompt, body.get("images"), "images")})
    return True, {**_common(body), "messages": messages}


def _with_images(text: Any, images: Any, where: str) -> Any:
    """A user message's content with Ollama's `images` (base64) before its text, as OpenAI's
    parts; the text as it is without images."""
    if images in (None, []):
        return text
    if not isinstance(images, list) or not all(isinstance(i, str) for i in images):
        raise invalid(where, f"{where} must be an array of base64 strings")
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": f"data:image;base64,{i}"}}
                                   for i in images]
    return [*parts, {"type": "text", "text": text if isinstance(text, str) else ""}]


def _common(body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"model": body.get("model"), "stream": body.get("stream", True)}
    if not isinstance(out["model"], str) or not out["model"]:
        raise invalid("model", "model is required")
    if not isinstance(out["stream"], bool):
        raise invalid("stream", "stream must be true or false")
    out.update(_options(body.get("options")))
    fmt = body.get("format")
    if fmt == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        out["response_format"] = {"type": "json_schema", "json_schema": {"schema": fmt}}
    elif fmt not in (None, ""):
        raise invalid("format", 'format must be "json" or a JSON schema')
    if body.get("think") is not None:
        out["think"] = body["think"]
    for name in ("tools", "tool_choice", "parallel_tool_calls"):  # (OpenAI's choices, which Ollama lacks)
        if body.get(name) is not None:
            out[name] = body[name]
    return out


def _options(options: Any) -> dict[str, Any]:
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise invalid("options", "options must be an object")
    out = {_OPTIONS[k]: v for k, v in options.items() if k in _OPTIONS and v is not None}
    limit = options.get("num_predict")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise invalid("options.num_predict", "options.num_predict must be an integer")
        if limit >= 0:
            out["max_tokens"] = max(limit, 1)
    stop = options.get("stop")
    if stop is not None:
        out["stop"] = stop
    return out


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise invalid("messages", "messages must be a non-empty array")
    out: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []  # the last assistant turn's calls not yet answered
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise invalid(where, f"{where} must be an object")
        message = {k: m[k] for k in ("role", "content") if k in m}
        if m.get("images") not in (None, []) and m.get("role") == "user":
            message["content"] = _with_images(m.get("content", ""), m["images"], f"{where}.images")
        if m.get("role") == "assistant":
            if isinstance(m.get("thinking"), str) and m["thinking"]:
                message["reasoning_content"] = m["thinking"]
            if m.get("tool_calls"):
                message["tool_calls"] = _calls(m["tool_calls"], where, len(out))
                pending = list(message["tool_calls"])
        elif m.get("role") == "tool":
            message["tool_call_id"] = _answered(pending, m.get("tool_name"), where)
        out.append(message)
    return out


def _calls(calls: Any, where: str, turn: int) -> list[dict[str, Any]]:
    """Ollama's calls (no ids; arguments as objects) in OpenAI's form, with ids of their own."""
    if not isinstance(calls, list):
        raise invalid(f"{where}.tool_calls", f"{where}.tool_calls must be an array")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            at = f"{where}.tool_calls[{j}]"
            raise invalid(at, f"{at} must be a function call with a name")
        arguments = fn.get("arguments", {})
        text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        function = {"name": fn["name"], "arguments": text}
        out.append({"id": f"call_{turn}_{j}", "type": "function", "function": function})
    return out


def _answered(pending: list[dict[str, Any]], name: Any, where: str) -> str:
    """The id of the call a tool message answers: the first pending one of its `tool_name`, or
    the first pending one."""
    if not pending:
        raise invalid(where, f"{where}: a tool result with no assistant tool call before it")
    at = next((k for k, c in enumerate(pending) if c["function"]["name"] == name), 0)
    return pending.pop(at)["id"]
