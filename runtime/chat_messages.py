"""A chat request's messages (OpenAI's form) checked and put in the form chat templates take:
roles, text content (a string or text parts), an assistant turn's tool calls with their
arguments as objects, a tool result's call id and name, and an earlier reply's reasoning.
The server's chat requests and `infer batch`'s lines share it."""

from __future__ import annotations

from typing import Any

from infer.runtime.errors import FieldError
from infer.runtime.tool_request import assistant_calls, tool_result


def chat_messages(value: Any) -> tuple[dict[str, Any], ...]:
    """OpenAI chat messages checked, in the form the chat templates take (FieldError names a
    field that is wrong)."""
    if not isinstance(value, list) or not value:
        raise FieldError("messages", "messages must be a non-empty array")
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # a call's id -> its function's name
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise FieldError(where, f"{where} must be an object")
        role = m.get("role")
        if role == "developer":
            role = "system"
        if m.get("function_call"):
            raise FieldError(f"{where}.function_call", f"{where}.function_call: the legacy function-calling "
                             "API is not supported (use tool_calls)", unsupported=True)
        if role not in ("system", "user", "assistant", "tool"):
            raise FieldError(f"{where}.role",
                             f"{where}.role must be system, developer, user, assistant or tool")
        calls = assistant_calls(m, where) if role == "assistant" and m.get("tool_calls") is not None else []
        content = m.get("content")
        media: list[Any] = []
        message = {**(tool_result(m, where, names) if role == "tool" else {"role": role}),
                   "content": "" if content is None and calls else _content(content, f"{where}.content",
                                                                           media if role == "user" else None)}
        if media:
            message["media"] = tuple(media)
        if calls:
            message["tool_calls"] = calls
            names.update((c["id"], c["function"]["name"]) for c in calls)
        reasoning = _history_reasoning(m, where) if role == "assistant" else None
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        out.append(message)
    return tuple(out)


def _history_reasoning(message: dict[str, Any], where: str) -> str | None:
    """An earlier reply's reasoning (llama-server's and vLLM's `reasoning_content`, also
    `reasoning` or Ollama's `thinking`), passed to templates that render it."""
    for name in ("reasoning_content", "reasoning", "thinking"):
        value = message.get(name)
        if value is not None:
            if not isinstance(value, str):
                raise FieldError(f"{where}.{name}", f"{where}.{name} must be a string")
            return value
    return None


def _content(value: Any, where: str, media: list[Any] | None = None) -> str:
    """A message's text: a string, or text parts joined. In a user message (`media` given), an
    `image_url` or `input_audio` part is a medium: appended to `media`, its place in the text
    libmtmd's marker."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise FieldError(where, f"{where} must be a string or an array of text parts")
    texts = []
    for j, part in enumerate(value):
        at = f"{where}[{j}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise FieldError(at, f"{at} must be an object with a type")
        if part["type"] in ("image_url", "input_audio") and media is not None:
            from infer.runtime.media import MARKER, part_medium

            media.append(part_medium(part, at))
            texts.append(MARKER)
            continue
        if part["type"] != "text":
            raise FieldError(f"{at}.type", f"{at}.type: a content part of type {part['type']!r} is not "
                             "supported", unsupported=True)
        if not isinstance(part.get("text"), str):
            raise FieldError(f"{at}.text", f"{at}.text must be a string")
        texts.append(part["text"])
    return "".join(texts)
