"""JSON schemas as grammars: which keywords llama.cpp's schema converter (the Python port in
llama-cpp-python) cannot enforce, and the schema it is given, for a reply's `response_format`
or a tool's arguments."""

from __future__ import annotations

import json
from typing import Any

from infer.runtime.errors import UsageError
from infer.runtime.llama import load_bindings_module

# Validation keywords that llama-cpp-python's schema converter ignores: a grammar built
# without them could let through output that fails the schema, so they are refused.
UNSUPPORTED_SCHEMA_KEYWORDS = frozenset({
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
    "minProperties", "maxProperties", "uniqueItems", "patternProperties", "not",
    "if", "then", "else", "dependentRequired", "dependentSchemas", "contains",
    "minContains", "maxContains", "propertyNames", "unevaluatedProperties", "unevaluatedItems",
})
# Keywords whose values are data, not subschemas: never searched for keywords.
_SCHEMA_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples", "required"})


# Lengths and counts the converter writes out in full (a rule nested once per item): above
# this, llama.cpp refuses the grammar, and far above it (a maxLength of 524,288 in Claude
# Code's tools) its parser overflows the stack.
MAX_REPEAT = 1000
_REPEAT_KEYWORDS = frozenset({"minLength", "maxLength", "minItems", "maxItems"})


def _unenforceable(key: str, value: Any, where: str) -> bool:
    if where.rsplit(".", 1)[-1] in ("properties", "$defs", "definitions"):  # (names, not keywords)
        return False
    if key in _REPEAT_KEYWORDS:
        return isinstance(value, int) and value > MAX_REPEAT
    return key in UNSUPPORTED_SCHEMA_KEYWORDS


def unsupported_keywords(node: Any, where: str = "") -> list[str]:
    """Where `node` has keywords a grammar here cannot enforce, as paths."""
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            here = f"{where}.{key}" if where else key
            if _unenforceable(key, value, where):
                found.append(f"{here} (over {MAX_REPEAT})" if key in _REPEAT_KEYWORDS else here)
            elif key not in _SCHEMA_DATA_KEYWORDS:
                found += unsupported_keywords(value, here)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += unsupported_keywords(value, f"{where}[{i}]")
    return found


def without_unsupported_keywords(node: Any, where: str = "") -> Any:
    """`node` without the keywords `unsupported_keywords` finds: for a tool that is not
    `strict`, whose schema is advice to the model (as OpenAI's and Anthropic's APIs treat it),
    the grammar holds the arguments to the rest."""
    if isinstance(node, dict):
        return {key: value if key in _SCHEMA_DATA_KEYWORDS else
                without_unsupported_keywords(value, f"{where}.{key}" if where else key)
                for key, value in node.items() if not _unenforceable(key, value, where)}
    if isinstance(node, list):
        return [without_unsupported_keywords(value, f"{where}[{i}]") for i, value in enumerate(node)]
    return node


def json_schema_to_grammar(schema_text: str) -> str:
    """Convert a JSON schema to a GBNF grammar with llama.cpp's converter."""
    try:
        schema = json.loads(schema_text)
    except json.JSONDecodeError as e:
        raise UsageError(f"the JSON schema is not valid JSON: {e}") from None
    if not isinstance(schema, (dict, bool)):
        raise UsageError("the JSON schema must be a JSON object")
    unsupported = unsupported_keywords(schema)
    if unsupported:
        raise UsageError(
            f"unsupported JSON schema keyword(s) {', '.join(unsupported)}: "
            "the output could not be guaranteed to validate"
        )
    converter = load_bindings_module("llama_grammar")
    try:
        grammar = str(converter.json_schema_to_gbnf(json.dumps(schema)))
    except Exception as e:  # the converter raises bare exceptions for unsupported schemas
        raise UsageError(f"unsupported JSON schema: {e}") from None
    # The Python port lets raw control characters into strings, which JSON forbids
    # (llama.cpp's C++ converter excludes them); exclude them here too.
    return grammar.replace('char ::= [^"\\\\]', 'char ::= [^"\\\\\\x7F\\x00-\\x1F]')


# Keywords that say what a value may be; a schema with none of them takes any JSON value.
_SHAPING_KEYWORDS = frozenset({
    "type", "enum", "const", "$ref", "oneOf", "anyOf", "allOf", "properties", "additionalProperties",
    "items", "prefixItems", "pattern", "format", "minLength", "maxLength", "minItems", "maxItems", "required",
})
_ANY = ["string", "number", "integer", "boolean", "object", "array", "null"]
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SUBSCHEMA = ("items", "additionalProperties", "not", "contains", "if", "then", "else", "propertyNames")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")


def with_any_values(node: Any) -> Any:
    """`node` with each of its (sub)schemas that says nothing of its value's shape (only a
    `description`, say: JSON Schema's "any value") given every JSON type, which the converter
    needs: it refuses such a schema, or reads an empty one as an object."""
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _SUBSCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: with_any_values(sub) for name, sub in value.items()}
        elif key in _SUBSCHEMA and isinstance(value, dict):
            out[key] = with_any_values(value)
        elif key in _SUBSCHEMA_LISTS and isinstance(value, list):
            out[key] = [with_any_values(sub) for sub in value]
        else:
            out[key] = value
    if not _SHAPING_KEYWORDS & out.keys():
        out["type"] = list(_ANY)
    return out
