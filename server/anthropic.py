"""Anthropic's Messages API at the edge (issue 35): a /v1/messages body becomes the chat
request the rest of the server already serves (OpenAI's form, checked by `schema`), and
errors take Anthropic's shape. The reply's shapes are in `anthropic_reply`.

What maps to what:
- `system` (a string or text blocks) -> a system message first; `role: "system"` messages
  (which Claude Code sends mid-conversation) -> system messages in their place (joined into
  the system prompt where the template takes none there: `template.render`);
- `messages`: text blocks joined; an assistant's `thinking` block -> its reasoning, its
  `tool_use` blocks -> tool calls (`input` as the arguments); a user's `tool_result` blocks ->
  `role: "tool"` messages (before the user's text, in their order); a user's base64 image
  blocks -> image_url parts (data: URLs) in their place; documents are refused (a 400 naming
  the block);
- `max_tokens` (required, as Anthropic requires it), `temperature`, `top_p`, `top_k` (which
  Anthropic's newer clients send only as extra body fields), `stop_sequences`, `stream`;
  `metadata` is accepted and not used; `output_config`'s `effort` (the thinking level) and
  `format` (a JSON schema the reply follows);
- `tools` (`name`, `description`, `input_schema`) -> function tools; `tool_choice` `auto`,
  `any` (-> required), `tool` (-> that function), `none`, and `disable_parallel_tool_use`;
- `thinking` `{"type": "enabled", "budget_tokens": N}` -> thinking on with a reasoning budget
  of N tokens, `disabled` -> off (a model without a switch notes it and goes on, as for
  `think`).
"""

from __future__ import annotations

import json
from typing import Any

from infer.server.errors import ApiError, invalid

# Anthropic's error types by HTTP status (its API reference, "Errors").
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                500: "api_error", 503: "overloaded_error", 529: "overloaded_error"}


def error_body(error: ApiError) -> dict[str, Any]:
    """An error as Anthropic's API writes it."""
    kind = _ERROR_TYPES.get(error.status, "api_error" if error.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def chat_body(body: dict[str, Any], *, count_only: bool = False) -> dict[str, Any]:
    """The chat request (OpenAI's form) a Messages body asks for; `count_only`: for
    /v1/messages/count_tokens, which takes no max_tokens."""
    out: dict[str, Any] = {"model": body.get("model")}
    if not isinstance(out["model"], str) or not out["model"]:
        raise invalid("model", "model: a string is required")
    messages = _system(body.get("system")) + _messages(body.get("messages"))
    out["messages"] = messages
    if not count_only:
        max_tokens = body.get("max_tokens")
        if max_tokens is None:
            raise invalid("max_tokens", "max_tokens: Field required")
        out["max_tokens"] = max_tokens
        for name in ("temperature", "top_p", "top_k", "stream"):
            if body.get(name) is not None:
                out[name] = body[name]
        stops = body.get("stop_sequences")
        if stops is not None:
            if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
                raise invalid("stop_sequences", "stop_sequences must be an array of strings")
            out["stop"] = stops
        if body.get("metadata") is not None and not isinstance(body["metadata"], dict):
            raise invalid("metadata", "metadata must be an object")
    out.update(_tools(body.get("tools"), body.get("tool_choice")))
    out.update(_thinking(body.get("thinking")))
    out.update(_output_config(body.get("output_config")))
    return out


_EFFORT = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}


def _output_config(value: Any) -> dict[str, Any]:
    """`effort` as the thinking level, `format` (a JSON schema) as the reply's schema."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid("output_config", "output_config must be an object")
    out: dict[str, Any] = {}
    effort = value.get("effort")
    if effort is not None:
        if effort not in _EFFORT:
            raise invalid("output_config.effort", f"output_config.effort must be one of {', '.join(_EFFORT)}")
        out["think"] = _EFFORT[effort]
    fmt = value.get("format")
    if fmt is not None:
        schema = fmt.get("schema") if isinstance(fmt, dict) and fmt.get("type") == "json_schema" else None
        if not isinstance(schema, dict):
            raise invalid("output_config.format", 'output_config.format must be {"type": "json_schema", '
                          '"schema": {...}}')
        out["response_format"] = {"type": "json_schema", "json_schema": {"schema": schema}}
    return out


def _system(value: Any, where: str = "system") -> list[dict[str, Any]]:
    if value is None or value == "" or value == []:
        return []
    if isinstance(value, str):
        return [{"role": "system", "content": value}]
    if isinstance(value, list):
        return [{"role": "system", "content": "\n\n".join(_texts(value, where))}]
    raise invalid(where, f"{where} must be a string or an array of text blocks")


def _texts(blocks: list[Any], where: str) -> list[str]:
    out = []
    for j, block in enumerate(blocks):
        at = f"{where}.{j}"
        text = block.get("text") if isinstance(block, dict) and block.get("type") == "text" else None
        if not isinstance(text, str):
            raise invalid(at, f"{at} must be a text block")
        out.append(text)
    return out


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise invalid("messages", "messages must be a non-empty array")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(value):
        where = f"messages.{i}"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
            raise invalid(f"{where}.role", f"{where}: a message must have role user, assistant or system")
        content = m.get("content")
        if m["role"] == "system":  # (Claude Code sends these after the first turn)
            out += _system(content, f"{where}.content")
        elif isinstance(content, str):
            out.append({"role": m["role"], "content": content})
        elif isinstance(content, list):
            out += _blocks(m["role"], content, f"{where}.content")
        else:
            raise invalid(f"{where}.content", f"{where}.content must be a string or an array of blocks")
    if all(m["role"] == "system" for m in out):
        raise invalid("messages", "messages must hold a user or assistant message")
    return out


def _blocks(role: str, blocks: list[Any], where: str) -> list[dict[str, Any]]:
    """One Anthropic message's blocks as chat messages: a user's tool results first (each a
    tool message), then the text; an assistant's text with its reasoning and calls."""
    texts: list[str] = []
    parts: list[dict[str, Any]] = []  # a user's text and images in order (OpenAI's parts)
    results: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for j, block in enumerate(blocks):
        at = f"{where}.{j}"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and role == "user":
            parts.append(_image(block, at))
        elif kind == "tool_result" and role == "user":
            results.append(_tool_result(block, at))
        elif kind == "tool_use" and role == "assistant":
            calls.append(_tool_use(block, at))
        elif kind == "thinking" and role == "assistant" and isinstance(block.get("thinking"), str):
            reasoning.append(block["thinking"])
        elif kind == "redacted_thinking" and role == "assistant":
            continue  # (encrypted by Anthropic: nothing a local model can read)
        elif kind in ("document", "search_result", "container_upload"):
            raise ApiError(400, f"{at}: a {kind} block is not supported by infer serve yet",
                           param=at, code="unsupported_parameter")
        else:
            raise invalid(at, f"{at}: a {kind!r} block is not valid in a {role} message" if kind
                          else f"{at} must be a block with a type")
    if role == "user":
        content: Any = parts if len(parts) > len(texts) else "".join(texts)  # (with images: the parts)
        return results + ([{"role": "user", "content": content}] if parts or not results else [])
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return [message]


def _image(block: dict[str, Any], at: str) -> dict[str, Any]:
    """An image block as OpenAI's image_url part: its base64 source as a data: URL, its url
    source as that URL (fetched with --allow-remote-media)."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "url" and isinstance(source.get("url"), str):
        return {"type": "image_url", "image_url": {"url": source["url"]}}
    if kind != "base64" or not isinstance(source.get("data"), str):
        raise invalid(f"{at}.source", f"{at}.source must be a base64 source (type, media_type, data) "
                      "or a url source (type, url)")
    media_type = source.get("media_type") if isinstance(source.get("media_type"), str) else "image/png"
    return {"type": "image_url", "image_url": {"url": f"data:{media_type};base64,{source['data']}"}}


def _tool_use(block: dict[str, Any], at: str) -> dict[str, Any]:
    if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
        raise invalid(at, f"{at}: a tool_use block needs an id and a name")
    arguments = block.get("input", {})
    if not isinstance(arguments, dict):
        raise invalid(f"{at}.input", f"{at}.input must be an object")
    return {"id": block["id"], "type": "function",
            "function": {"name": block["name"], "arguments": json.dumps(arguments, ensure_ascii=False)}}


def _tool_result(block: dict[str, Any], at: str) -> dict[str, Any]:
    if not isinstance(block.get("tool_use_id"), str):
        raise invalid(f"{at}.tool_use_id", f"{at}.tool_use_id must be a string")
    content = block.get("content", "")
    if isinstance(content, list):
        content = "".join(_texts(content, f"{at}.content"))
    elif not isinstance(content, str):
        raise invalid(f"{at}.content", f"{at}.content must be a string or an array of text blocks")
    if block.get("is_error") is True:
        content = f"Error: {content}"
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": content}


def _tools(tools: Any, choice: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if tools is not None:
        if not isinstance(tools, list):
            raise invalid("tools", "tools must be an array")
        functions = []
        for j, tool in enumerate(tools):
            at = f"tools.{j}"
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                raise invalid(at, f"{at} must be a tool with a name")
            if tool.get("type") not in (None, "custom"):
                raise ApiError(400, f"{at}: Anthropic's server tool {tool['type']!r} is not supported by "
                               "infer serve (give client tools: name, description, input_schema)",
                               param=at, code="unsupported_parameter")
            function = {"name": tool["name"], "parameters": tool.get("input_schema", {"type": "object"})}
            if tool.get("strict") is True:
                function["strict"] = True
            if isinstance(tool.get("description"), str):
                function["description"] = tool["description"]
            functions.append({"type": "function", "function": function})
        if functions:
            out["tools"] = functions
    if choice is None:
        return out
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise invalid("tool_choice", "tool_choice.type must be auto, any, tool or none")
    kind = choice["type"]
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise invalid("tool_choice.name", "tool_choice of type tool needs the tool's name")
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    if choice.get("disable_parallel_tool_use") is True:
        out["parallel_tool_calls"] = False
    return out


def _thinking(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "disabled":
        return {"think": False}
    if kind in ("adaptive", "between_tools"):
        return {"think": True}
    if kind != "enabled":
        raise invalid("thinking", "thinking must be {\"type\": \"enabled\", \"budget_tokens\": N} or "
                      "{\"type\": \"disabled\"}")
    budget = value.get("budget_tokens")
    if budget is None:
        return {"think": True}
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise invalid("thinking.budget_tokens", "thinking.budget_tokens must be a positive integer")
    return {"think": True, "reasoning_budget": budget}
