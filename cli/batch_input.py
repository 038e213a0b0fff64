"""`infer batch` input: JSONL requests or plain lines, each becoming messages and per-line settings.

A JSON line is ``{"id": …, "prompt": "…"}`` or ``{"id": …, "messages": [...]}``,
optionally with ``system``, ``max_tokens``, ``temperature``, ``seed``,
``json_schema`` (an object or its JSON text), ``stop`` (a string or a list), a thinking
model's ``think`` (true, false or a level), ``reasoning_budget`` and ``chat_template_kwargs``,
and ``tools``, ``tool_choice`` and ``parallel_tool_calls`` as in OpenAI's chat API (the
messages too may hold earlier calls and tool results), and ``images`` / ``audio`` (each a
list of file paths or base64 data) for the last user message, before its text; messages may
hold OpenAI's ``image_url`` (data: URLs) and ``input_audio`` parts as well.
With ``--lines`` each non-empty line is one prompt, wrapped by ``--template``
("Classify: {line}"). A line that cannot be read becomes an item with an error.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from infer.runtime.chat_messages import chat_messages
from infer.runtime.errors import FieldError, InferError, UsageError
from infer.runtime.tool_request import parse_tools

# Per-line settings and the SamplingParams field each one sets.
LINE_SETTINGS = {"max_tokens": "max_tokens", "temperature": "temperature", "seed": "seed",
                 "json_schema": "json_schema", "stop": "stop"}
# Per-line thinking settings, in their flags' form (cli/flags.thinking_request reads them).
LINE_THINKING = ("think", "reasoning_budget", "chat_template_kwargs")
LINE_TOOLS = ("tools", "tool_choice", "parallel_tool_calls")  # (runtime/tool_request.py reads them)
_BASE64 = re.compile(r"[A-Za-z0-9+/]{16,}={0,2}")  # (long base64 data, not a file's path)


@dataclass
class Item:
    index: int  # 0-based position in the input
    id: Any
    messages: list[dict[str, Any]] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    thinking: dict[str, Any] = field(default_factory=dict)  # LINE_THINKING's, as their flags give them
    tools: Any = None  # the line's tools (runtime.tool_request.ToolRequest), if it has any
    error: str | None = None


def check_template(template: str | None) -> None:
    if template is not None and "{line}" not in template:
        raise UsageError("--template must contain {line}, where each input line goes")


def read_items(lines: Iterable[str], *, plain: bool, template: str | None,
               system: str | None) -> Iterator[Item]:
    """One Item per input line (blank lines are skipped); ids default to the line number."""
    index = 0
    for number, raw in enumerate(lines, start=1):
        line = raw.rstrip("\r\n")
        if not line.strip():
            continue
        if plain:
            text = template.replace("{line}", line) if template is not None else line
            item = Item(index, number, _with_system([{"role": "user", "content": text}], system))
        else:
            item = _json_item(index, number, line, system)
        index += 1
        yield item


def _json_item(index: int, number: int, line: str, system: str | None) -> Item:
    try:
        data = json.loads(line)
    except ValueError as e:
        return Item(index, number, error=f"line {number} is not JSON ({e})")
    if not isinstance(data, dict):
        return Item(index, number, error=f"line {number} is not a JSON object")
    item = Item(index, data.get("id", number))
    prompt, messages = data.get("prompt"), data.get("messages")
    if isinstance(prompt, str) and messages is None:
        messages = [{"role": "user", "content": prompt}]
    elif not (isinstance(messages, list) and messages and prompt is None):
        item.error = 'each line needs "prompt" (a string) or "messages" (a list of {role, content})'
        return item
    try:
        messages = list(chat_messages(messages))
        if any(key in data for key in LINE_TOOLS):
            item.tools = parse_tools({key: data[key] for key in LINE_TOOLS if key in data})
    except FieldError as e:
        item.error = str(e)
        return item
    line_system = data.get("system", system)
    if line_system is not None and not isinstance(line_system, str):
        item.error = '"system" must be a string'
        return item
    try:
        messages = _with_media(messages, data)
    except InferError as e:
        item.error = str(e)
        return item
    has_system = any(m["role"] == "system" for m in messages)
    item.messages = messages if has_system else _with_system(messages, line_system)
    for key, name in LINE_SETTINGS.items():
        if key in data:
            value = data[key]
            if key == "json_schema" and not isinstance(value, str):
                value = json.dumps(value)
            elif key == "stop":
                value = (value,) if isinstance(value, str) else tuple(value)
            item.settings[name] = value
    for key in LINE_THINKING:
        value = data.get(key)
        if isinstance(value, bool) and key == "think":  # (Ollama's true and false)
            value = "on" if value else "off"
        elif key == "chat_template_kwargs" and value is not None:
            value = json.dumps(value)
        if value is not None:
            item.thinking[key] = value
    return item


def _with_media(messages: list[dict[str, Any]], data: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages with the line's ``images`` and ``audio`` (paths or base64) added to its
    last user message, their markers before its text."""
    import base64
    import binascii
    import os

    from infer.runtime.media import medium, place_markers, read_medium

    added = []
    for key, kind in (("images", "image"), ("audio", "audio")):
        value = data.get(key)
        if value is None:
            continue
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise UsageError(f'"{key}" must be a list of file paths or base64 data')
        for i, v in enumerate(value):
            if os.path.isfile(v) or not _BASE64.fullmatch(v):  # (a path: read, or "no such file")
                added.append(read_medium(v, kind))
                continue
            try:
                added.append(medium(f"{key}[{i}]", base64.b64decode(v, validate=True), kind))
            except (binascii.Error, ValueError):
                raise UsageError(f"{key}[{i}]: neither a file nor base64 data") from None
    if not added:
        return messages
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not users:
        raise UsageError('"images" and "audio" go with a user message: the line has none')
    last = dict(messages[users[-1]])
    text = str(last.get("content") or "")
    last["content"] = place_markers(text, len(added)) if "media" not in last else \
        place_markers("", len(added)) + text
    last["media"] = (*added, *last.get("media", ()))
    return [*messages[:users[-1]], last, *messages[users[-1] + 1:]]


def _with_system(messages: list[dict[str, Any]], system: str | None) -> list[dict[str, Any]]:
    return ([{"role": "system", "content": system}] if system else []) + list(messages)


def done_ids(lines: Iterable[str]) -> set[str]:
    """The ids (as JSON text) that an earlier run's output holds results for (errors excluded)."""
    done = set()
    for line in lines:
        try:
            data = json.loads(line)
        except ValueError:
            continue  # a line cut short when the earlier run was stopped
        if isinstance(data, dict) and "id" in data and "error" not in data:
            done.add(json.dumps(data["id"]))
    return done
