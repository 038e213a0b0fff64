"""The tool-calling fields of a request, checked (issue 33), for the server and `infer run
--tools` alike (a FieldError names the field): `tools` (function tools with
JSON-schema parameters), `tool_choice` (auto, none, required, or one function by name),
`parallel_tool_calls`, and a history's assistant turns with `tool_calls` and `role: "tool"`
results, made into the messages chat templates read (arguments as objects, a result's function
name beside its call id)."""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from typing import Any

from infer.runtime.errors import FieldError

_NAME = re.compile(r"[A-Za-z0-9_\-.]{1,64}")
# Tools Llama 3.1-3.3 were trained to call in a form of their own, `<|python_tag|>NAME.call(...)`
# (Meta's model card; its code_interpreter, which writes bare code rather than a call, is left
# out): a template that reads `builtin_tools` is told which of a request's tools these are.
BUILT_IN = ("brave_search", "wolfram_alpha")


@dataclass(frozen=True)
class ToolRequest:
    """A request's tools. `choice`: "auto", "none", "required" or "function" (then `name`)."""

    tools: tuple[dict[str, Any], ...] = ()
    choice: str = "auto"
    name: str | None = None
    parallel: bool = True

    @property
    def active(self) -> bool:
        """Whether the reply may hold calls."""
        return bool(self.tools) and self.choice != "none"


def template_tools(tools: Any, source: str) -> dict[str, Any]:
    """The variables the chat template `source` is given for a request's `tools`."""
    names = [t.get("function", t).get("name") for t in tools] if "builtin_tools" in source else []
    built_in = [n for n in names if n in BUILT_IN]
    return {"tools": [dict(t) for t in tools], **({"builtin_tools": built_in} if built_in else {})}


def parse_tools(body: dict[str, Any]) -> ToolRequest:
    for legacy in ("functions", "function_call"):
        if body.get(legacy) is not None:
            raise FieldError(legacy, f"{legacy}: the legacy function-calling API is not supported (use tools "
                             "and tool_choice)", unsupported=True)
    raw = body.get("tools")
    tools = _tools(raw) if raw is not None else ()
    choice, name = _choice(body.get("tool_choice"), tools)
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise FieldError("parallel_tool_calls", "parallel_tool_calls must be a boolean")
    return ToolRequest(tools, choice, name, parallel)


def _tools(value: Any) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list):
        raise FieldError("tools", "tools must be an array")
    out, seen = [], set()
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise FieldError(f"{where}.type", f"{where} must be an object of type \"function\"")
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not _NAME.fullmatch(fn["name"]):
            raise FieldError(f"{where}.function.name",
                             f"{where}.function.name must be 1 to 64 letters, digits, '_', '-' or '.'")
        if fn["name"] in seen:
            raise FieldError(f"{where}.function.name", f"two tools are named {fn['name']!r}")
        seen.add(fn["name"])
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise FieldError(f"{where}.function.parameters",
                          f"{where}.function.parameters must be a JSON schema object")
        description = fn.get("description")
        if description is not None and not isinstance(description, str):
            raise FieldError(f"{where}.function.description",
                             f"{where}.function.description must be a string")
        function = {"name": fn["name"], **({"description": description} if description else {}),
                    "parameters": params, **({"strict": True} if fn.get("strict") is True else {})}
        out.append({"type": "function", "function": function})
    return tuple(out)


def _choice(value: Any, tools: tuple[dict[str, Any], ...]) -> tuple[str, str | None]:
    if value is None:
        return "auto", None
    if value in ("auto", "none", "required"):
        if value != "none" and not tools:
            raise FieldError("tool_choice", "tool_choice needs tools")
        return value, None
    fn = value.get("function") if isinstance(value, dict) and value.get("type") == "function" else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise FieldError("tool_choice", 'tool_choice must be "auto", "none", "required" or '
                      '{"type": "function", "function": {"name": ...}}')
    if fn["name"] not in {t["function"]["name"] for t in tools}:
        raise FieldError("tool_choice", f"tool_choice names {fn['name']!r}, which is not among the tools")
    return "function", fn["name"]


def template_calls(messages: list[Any], *, strings: bool = False) -> list[Any]:
    """`messages` with each assistant turn's calls as chat templates read them (`assistant_calls`)."""
    return [{**m, "tool_calls": assistant_calls(dict(m), f"messages[{i}]", strings=strings)}
            if m.get("tool_calls") else m for i, m in enumerate(messages)]


def assistant_calls(message: dict[str, Any], where: str, *, strings: bool = False) -> list[dict[str, Any]]:
    """An earlier assistant turn's calls, with their arguments as objects (most templates walk
    them; OpenAI sends a JSON string; one that is not JSON stays a string), or, `strings`, as
    JSON text (for a template that writes the text it is given: functionary v3.2)."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        raise FieldError(f"{where}.tool_calls", f"{where}.tool_calls must be a non-empty array")
    out = []
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise FieldError(at, f"{at} must be a function call with a name")
        arguments = fn.get("arguments", "{}")
        if isinstance(arguments, str):
            with contextlib.suppress(ValueError):
                arguments = json.loads(arguments) if arguments.strip() else {}
        if strings and not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        call_id = call.get("id") if isinstance(call.get("id"), str) else f"call_{j}"
        function = {"name": fn["name"], "arguments": arguments}
        out.append({"id": call_id, "type": "function", "function": function})
    return out


def tool_result(message: dict[str, Any], where: str, names: dict[str, str]) -> dict[str, Any]:
    """A `role: "tool"` message with its call's id and, for templates that want it, the
    function's name (from the call in the history)."""
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str):
        raise FieldError(f"{where}.tool_call_id", f"{where}.tool_call_id must be a string")
    out = {"role": "tool", "tool_call_id": call_id}
    name = message.get("name") if isinstance(message.get("name"), str) else names.get(call_id)
    if name:
        out["name"] = name
    return out
