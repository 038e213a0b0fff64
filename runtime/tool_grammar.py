"""A GBNF grammar whose only sentences are tool calls in a template's syntax (issue 33), for
`tool_choice: required` or one named function: the markers as the template writes them, a
tool's name, and arguments that validate against its JSON schema (llama.cpp's schema converter
writes their rules). Where arguments are keys and values between markers, a string value is
any text without the marker that ends it, any other value JSON of its schema.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from infer.runtime.errors import FieldError, UsageError
from infer.runtime.tool_syntax import ID, INDEX, Pairs, ToolSyntax

_SLOTS = {INDEX: "[0-9]+", ID: "[a-zA-Z0-9]{9}"}
MAX_CALLS = 8  # calls in one reply at most (a small model may otherwise call again and again)


def literal(text: str, index: int | None = None) -> str:
    """`text` as GBNF: quoted pieces, with a call's number (`index` where known) or id as the
    characters they take."""
    if index is not None:
        text = text.replace(INDEX, str(index))
    parts, piece = [], ""
    for ch in text:
        if ch in _SLOTS:
            if piece:
                parts.append(json.dumps(piece, ensure_ascii=False))
            parts.append(_SLOTS[ch])
            piece = ""
        else:
            piece += ch
    if piece or not parts:
        parts.append(json.dumps(piece, ensure_ascii=False))
    return " ".join(parts)


def calls_grammar(syntax: ToolSyntax, tools: Sequence[Mapping[str, Any]], *, name: str | None = None,
                  parallel: bool = True) -> str:
    """The grammar of one call (or, `parallel` where the template writes several, one or more)
    of `tools` (only `name` where given)."""
    from infer.runtime.llama import load_bindings_module

    module = load_bindings_module("llama_grammar")
    converter = module.SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    rules: dict[str, str] = {}
    bodies: dict[str, list[str]] = {"": [], "-alt": []}  # (the calls' rules, in each form the syntax has)
    forms = dict(zip(("", "-alt"), syntax.forms, strict=False))
    for i, tool in enumerate(tools):
        fn = tool.get("function", tool)
        if name is not None and fn["name"] != name:
            continue
        try:
            for suffix, form in forms.items():
                bodies[suffix].append(_call_body(converter, rules, form, i, fn, suffix))
        except UsageError:
            raise
        except Exception as e:  # (the converter raises bare exceptions for what it cannot do)
            raise UsageError(f"the parameters of tool {fn['name']!r} cannot be enforced: {e}") from None
    if not bodies[""]:
        raise UsageError(f"no tool named {name!r}")
    rules["root"] = " | ".join(_calls(rules, form, bodies[suffix], suffix, parallel=parallel)
                               for suffix, form in forms.items())
    grammar = "\n".join(f"{k} ::= {v}" for k, v in rules.items()) + "\n" + converter.format_grammar()
    # (the port lets raw control characters into JSON strings, which JSON forbids)
    return grammar.replace('char ::= [^"\\\\]', 'char ::= [^"\\\\\\x7F\\x00-\\x1F]')


def _calls(rules: dict[str, str], syntax: ToolSyntax, bodies: list[str], suffix: str, *,
           parallel: bool) -> str:
    """The calls of one form of `syntax`, their opening and closing markers around them (the
    white space before the opening one as the reply likes: gpt-oss' " to=" after its header)."""
    opening = (syntax.section_open + syntax.call_open)[len(syntax.prompted):]  # (after the prompt's part)
    lead = opening[:len(opening) - len(opening.lstrip())]
    first = _seq(f"{literal(lead)}?" if lead else "", literal(opening.lstrip()))
    last = literal((syntax.call_close + syntax.section_close).rstrip())
    between = literal(syntax.call_close + syntax.call_sep + syntax.call_open)
    numbered = any(INDEX in text for text in (syntax.name_close, *(str(v) for _, v in syntax.extras)))
    many = parallel and syntax.parallel
    if not numbered:
        rules[f"call{suffix}"] = " | ".join(bodies)
        more = f" ({between} call{suffix}){{0,{MAX_CALLS - 1}}}" if many else ""
        return _seq(first, f"call{suffix}{more}", last)
    for n in range(MAX_CALLS if many else 1):  # (each call's number written out)
        rules[f"call{suffix}-n{n}"] = " | ".join(f"{b}-n{n}" for b in bodies)
        for b in bodies:
            rules[f"{b}-n{n}"] = rules[b].replace(_SLOTS[INDEX], literal(INDEX, syntax.index_base + n))
    calls = ""
    for n in range(MAX_CALLS - 1 if many else 0, 0, -1):
        calls = f" ({between} call{suffix}-n{n}{calls})?"
    return _seq(first, f"call{suffix}-n0{calls}", last)


def calls_params(params: Any, syntax: ToolSyntax, request: Any, model: Any = None) -> Any:
    """The sampling parameters (runtime.sampling.SamplingParams) of a reply that may call the
    tools of `request` (runtime.tool_request.ToolRequest): `required` or one function, held to a
    grammar of calls; `auto`, free text until the calls' opening, then held to that grammar
    (a grammar that waits for `trigger_pattern`: runtime/llama/grammar_trigger.py); `none`
    as they are. With `auto`, a grammar or JSON schema of the request's own wins: the reply
    is held to it, and calls are read as the model writes them. The `model`'s control tokens
    among the calls' markers are shown in the reply's text, where the calls are read."""
    from dataclasses import replace

    if request.choice == "none":
        return params
    shown = marker_tokens(syntax, model) if model is not None else frozenset()
    syntax = ended_by_model(syntax, model) if model is not None else syntax
    if request.choice == "auto" and params.effective_grammar is not None:
        return replace(params, _shown_tokens=params._shown_tokens | shown)
    if params.effective_grammar is not None:
        raise FieldError("tool_choice", f"tool_choice {request.name or request.choice!r} holds the reply to "
                         "tool calls: it cannot go with a grammar or a JSON schema")
    grammar = calls_grammar(syntax, request.tools, name=request.name, parallel=request.parallel)
    triggers = (trigger_pattern(syntax, request.tools),) if request.choice == "auto" else ()
    return replace(params, grammar=grammar, _grammar_triggers=triggers,
                   _shown_tokens=params._shown_tokens | shown)


def ended_by_model(syntax: ToolSyntax, model: Any) -> ToolSyntax:
    """`syntax` without a token that ends generation at the end of its calls (gpt-oss'
    ``<|call|>``, Llama's ``<|eom_id|>``): a grammar lets such a token through only once it is
    complete, so a grammar that wrote it would have the model spell it out. The grammar ends
    before it, and the model's own token ends the reply (the calls are read without it)."""
    from dataclasses import replace

    def cut(form: ToolSyntax) -> ToolSyntax:
        tokens = model.tokenize(form.section_close, add_special=False, parse_special=True)
        end = model.special_token_text(tokens[-1]) if tokens and model.is_eog(tokens[-1]) else ""
        return replace(form, section_close=form.section_close[:-len(end)]) if end and \
            form.section_close.endswith(end) else form

    return replace(cut(syntax), alternate=cut(syntax.alternate) if syntax.alternate else None)


def marker_tokens(syntax: ToolSyntax, model: Any) -> frozenset[int]:
    """The control tokens of the calls' markers, in every form of `syntax`."""
    texts = [getattr(form, name) for form in syntax.forms
             for name in ("section_open", "call_open", "name_close", "call_close", "call_sep",
                          "section_close")]
    tokens = model.tokenize("".join(t.replace(INDEX, " ").replace(ID, " ") for t in texts), add_special=False,
                            parse_special=True)
    return frozenset(t for t in tokens if model.is_control(t))


def trigger_pattern(syntax: ToolSyntax, tools: Sequence[Mapping[str, Any]] = ()) -> str:
    """For `tool_choice: auto`: the pattern (llama.cpp's lazy grammar: over the text so far, its
    group where the grammar starts) of the calls' opening as the grammar writes it, in any of
    the syntax's forms, so that the text it feeds the grammar is always one the grammar takes.
    Where the prompt wrote the start of the opening, a reply may call at once: from its start,
    or after that start written again, the rest of the opening and one of the `tools`' names."""
    if syntax.prompted:
        opening = syntax.section_open + syntax.call_open
        names = "|".join(re.escape(t.get("function", t)["name"]) for t in tools)
        called = r"\{" if syntax.json_keys is not None else f"(?:{names}){re.escape(syntax.name_close)}"
        rest = re.escape(opening[len(syntax.prompted):])
        return r"(?:[\s\S]*?" + re.escape(syntax.prompted) + ")?(" + rest + called + r"[\s\S]*)"
    return r"[\s\S]*?((?:" + "|".join(_opening(form) for form in syntax.forms) + r")[\s\S]*)"


def _opening(syntax: ToolSyntax) -> str:
    if syntax.json_keys is not None and not (syntax.section_open + syntax.call_open).strip():
        return r'\{ ?"' + re.escape(syntax.json_keys[0]) + '"' if syntax.json_keys[0] else r"\{"
    return re.escape(syntax.trigger)


def _schema_rule(converter: Any, schema: Any, rule: str, strict: bool) -> str:
    """The rule of arguments that follow `schema`. Keywords no grammar here enforces (numeric
    bounds, `not`...) refuse a `strict` tool's call and are left to the model otherwise."""
    from infer.runtime.json_schema import unsupported_keywords, with_any_values, without_unsupported_keywords

    unsupported = unsupported_keywords(schema)
    if unsupported and strict:
        raise UsageError(f"unsupported JSON schema keyword(s) {', '.join(unsupported)} in a strict tool")
    schema = with_any_values(without_unsupported_keywords(schema))
    return str(converter.visit(converter.resolve_refs(schema, "tools"), rule))


def _seq(*parts: str) -> str:
    """GBNF items in sequence, empty literals left out."""
    return " ".join(p for p in parts if p and p != '""') or '""'


def _call_body(converter: Any, rules: dict[str, str], syntax: ToolSyntax, i: int,
               fn: Mapping[str, Any], suffix: str = "") -> str:
    schema = fn.get("parameters") or {"type": "object", "properties": {}}
    rule, named = f"call-{i}{suffix}", _seq(literal(fn["name"]), literal(syntax.name_close))
    if syntax.pairs is not None:
        rules[rule] = _seq(named, _pairs(converter, rules, syntax.pairs, i, schema, fn.get("strict") is True))
        return rule
    args = _schema_rule(converter, schema, f"tool-{i}-arguments", fn.get("strict") is True)
    if syntax.json_keys is None:
        rules[rule] = _seq(named, args)
        return rule
    name_key, args_key = syntax.json_keys
    if not name_key:  # ({"NAME": {...}}: Apertus')
        rules[rule] = f'"{{" space {literal(json.dumps(fn["name"]))} space ":" space {args} space "}}"'
        return rule
    extras = dict(syntax.extras)
    fields = [f'{literal(json.dumps(key))} space ":" space '
              + (literal(json.dumps(fn["name"])) if key == name_key else args if key == args_key
                 else _extra(extras.get(key))) + " space"
              for key in syntax.json_order or (name_key, args_key)]
    rules[rule] = '"{" space ' + ' "," space '.join(fields) + ' "}"'
    return rule


def _extra(value: Any) -> str:
    if value == ID:
        return f'"\\"" {_SLOTS[ID]} "\\""'
    if value == INDEX:
        return _SLOTS[INDEX]
    if value == INDEX + "s":
        return f'"\\"" {_SLOTS[INDEX]} "\\""'
    return literal(json.dumps(value))


def _pairs(converter: Any, rules: dict[str, str], pairs: Pairs, i: int, schema: Mapping[str, Any],
           strict: bool) -> str:
    """The arguments as keys and values: the required ones, then any of the others, in the
    schema's order."""
    props = schema.get("properties") or {}
    required = [k for k in props if k in (schema.get("required") or ())]
    optional = [k for k in props if k not in required]
    items = {key: _pair(converter, rules, pairs, i, key, props[key], strict) for key in props}
    sep = literal(pairs.sep) if pairs.sep else ""

    def after(keys: list[str]) -> list[str]:  # (each of `keys` or none, each after a separator)
        return [f"({_seq(sep, items[k])})?" for k in keys]

    if required:
        return _seq(items[required[0]], *(_seq(sep, items[k]) for k in required[1:]), *after(optional))
    if not optional:
        return '""'
    ways = [_seq(items[k], *after(optional[n + 1:])) for n, k in enumerate(optional)]
    return "(" + " | ".join(ways) + ")?"


def _pair(converter: Any, rules: dict[str, str], pairs: Pairs, i: int, key: str, schema: Any,
          strict: bool) -> str:
    kind = "string" if isinstance(schema, dict) and schema.get("type") == "string" else "other"
    rule = f"tool-{i}-value-{len(rules)}"
    if kind == "string":
        rules[rule] = _raw_string(schema, pairs.after_value["string"].strip())
    else:
        rule = _schema_rule(converter, schema if isinstance(schema, dict) else {}, rule, strict)
    return _seq(literal(pairs.before_key), literal(key), literal(pairs.after_key[kind]), rule,
                literal(pairs.after_value[kind]))


def _raw_string(schema: Mapping[str, Any], end: str) -> str:
    """A string value written as is: one of its `enum` (or its `const`), at most `maxLength`
    characters, or any text without the marker that ends it."""
    choices = schema.get("enum") if isinstance(schema.get("enum"), list) else \
        [schema["const"]] if isinstance(schema.get("const"), str) else None
    if choices and all(isinstance(c, str) for c in choices):
        return " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
    if isinstance(schema.get("maxLength"), int) and end:
        return f"[^{_in_class(end[0])}]{{0,{schema['maxLength']}}}"
    return _without(end)


def _without(marker: str) -> str:
    """Any text in which `marker` does not stand (nor ends it with a part of the marker)."""
    if not marker:
        return '[^\\n]*'
    ways = [_seq(json.dumps(marker[:j], ensure_ascii=False) if j else "", f"[^{_in_class(marker[j])}]")
            for j in range(len(marker))]
    return "(" + " | ".join(ways) + ")*"


def _in_class(ch: str) -> str:
    return "\\" + ch if ch in "]\\^-[" else json.dumps(ch, ensure_ascii=False)[1:-1]
