"""How a chat template writes tool calls, learned from what it renders (issue 33).

The template renders an assistant turn with one probe call, and one with two, after a user
turn (with the probe tools given, as a request gives them). The text the calls add is taken
apart, never matched against a list of model names, so a template never seen before that
writes its calls in a known shape works:

- the call is one JSON object holding the name and the arguments (Hermes and Qwen's
  ``<tool_call>{"name": …, "arguments": …}</tool_call>``, Llama 3.x's ``parameters``, Command
  R7B's list, Mistral Nemo's ``[TOOL_CALLS][…]``, Apertus' ``{"NAME": {…}}``),
- or the name is written and then the arguments as a JSON object (DeepSeek V3.1, Kimi K2's
  ``functions.NAME:0``, Mistral's ``[TOOL_CALLS]NAME[ARGS]{…}``, gpt-oss' ``to=functions.NAME``,
  functionary's ``<function=NAME>{…}``),
- or the name and then each argument as a key and a value between markers (Qwen3-Coder's
  ``<parameter=KEY>``, GLM's ``<arg_key>``, MiniMax's ``<parameter name="KEY">``, DeepSeek
  V3.2's DSML, Seed-OSS, MiniCPM, LFM2's ``NAME(key='value')``).

What stands around the calls, around each and between them, and what counts the calls
(Kimi's ``:0``) or carries a call's id, come from comparing the renderings. Where the template
writes built-in tools' calls in a form of their own, that form is the syntax's `alternate`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from infer.runtime.template import render
from infer.runtime.tool_turn import clean, empty_block, prompted_lead, turn_calls

NAMES = ("fnAlpha", "fnBeta")
ARGS: tuple[dict[str, Any], ...] = ({"pA": "vAlpha"}, {"pB": "vBeta", "pC": 7})
IDS = ("Ab3dE6gH9", "Jk2mN5pQ8")  # alphanumeric, 9 characters (Mistral's templates insist)
INDEX, ID = "\ue001", "\ue000"  # where a call's number or its id stands in learned text


def probe_tools() -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": name, "description": "A probe.", "parameters": {
        "type": "object", "required": list(args),
        "properties": {k: {"type": "string" if isinstance(v, str) else "integer"} for k, v in args.items()}}}}
        for name, args in zip(NAMES, ARGS, strict=True)]


@dataclass(frozen=True)
class Pairs:
    """Arguments as keys and values between markers: a string value as is, any other as JSON;
    `after_key`, `after_value` by its kind ("string", "other": DSML's ``string="true"``)."""

    before_key: str
    after_key: Mapping[str, str]
    after_value: Mapping[str, str]
    sep: str


@dataclass(frozen=True)
class ToolSyntax:
    """How a template writes tool calls: `section_open`, then each call as `call_open`, the
    name, `name_close`, the arguments, `call_close`, with `call_sep` between calls, then
    `section_close`. `json_keys`: the call is one JSON object with the name and arguments under
    these keys ("" for both: the name is the object's only key); `extras` its other keys, each
    a constant, the call's number or its id. `pairs`: arguments as keys and values (None: a
    JSON object). `index_base`: the first call's number where one is written. `parallel`: the
    template writes more than one call in a turn."""

    section_open: str
    call_open: str
    name_close: str
    call_close: str
    call_sep: str
    section_close: str
    json_keys: tuple[str, str] | None = None
    extras: tuple[tuple[str, Any], ...] = ()
    json_order: tuple[str, ...] = ()  # a JSON call's keys in the order the template writes them
    pairs: Pairs | None = None
    index_base: int = 0
    parallel: bool = True
    content_first: bool = field(default=True, compare=False)  # the template keeps text before calls
    alternate: ToolSyntax | None = None  # the same calls as a model may also write them (harmony, built-in)
    string_arguments: bool = False  # the template writes an earlier call's arguments as the JSON string given
    prompted: str = ""  # the start of the calls' opening the generation prompt writes (functionary v3.2)
    content_lead: str = ""  # what a reply writes after `prompted` before its text (functionary's "all\n")

    @property
    def forms(self) -> tuple[ToolSyntax, ...]:
        """The forms a reply may write these calls in: this one, then its alternate."""
        return (self,) if self.alternate is None else (self, self.alternate)

    @property
    def trigger(self) -> str:
        """The text that starts the calls in a reply (for a JSON object call with no marker,
        its opening up to the name key)."""
        start = (self.section_open + self.call_open).strip()
        if start or self.json_keys is None:
            return start.split(INDEX)[0].split(ID)[0]
        return '{ "' + self.json_keys[0] + '"' if self.json_keys[0] else "{"  # (any space after "{")


def _call(i: int, n: int, arguments: Any) -> dict[str, Any]:
    """Probe call `i` as the turn's `n`th call."""
    return {"id": IDS[n], "type": "function", "function": {"name": NAMES[i], "arguments": arguments}}


@functools.lru_cache(maxsize=64)
def learn(source: str, *, bos_token: str = "", eos_token: str = "",
          builtin: bool = False) -> ToolSyntax | None:
    """The tool-call syntax of the chat template `source`, or None where it renders no calls;
    `builtin`: of tools it is told are built in (Llama 3.x's ``<|python_tag|>NAME.call(k="v")``)."""
    given = {"tools": probe_tools(), **({"builtin_tools": list(NAMES)} if builtin else {})}

    def rendered(messages: list[dict[str, Any]], generation: bool = False) -> str:
        try:
            return render(source, messages, bos_token=bos_token, eos_token=eos_token,
                          add_generation_prompt=generation, variables=given)
        except Exception:  # (a template that refuses this probe renders no calls of this kind)
            return ""

    empty = empty_block(source, bos_token, eos_token)
    strings = False  # (the arguments as objects; where those render no call, as JSON strings)

    def calls_text(*which: int) -> tuple[str, bool]:
        args = [{k: str(v) for k, v in ARGS[i].items()} if builtin else json.dumps(ARGS[i]) if strings
                else ARGS[i] for i in which]
        text, kept = turn_calls(rendered, [_call(i, n, args[n]) for n, i in enumerate(which)], empty)
        for n in range(len(which)):
            text = text.replace(IDS[n], ID)
        return text, kept

    one, kept = calls_text(0)
    if NAMES[0] not in one and not builtin:
        strings = True  # (functionary v3.2 adds the arguments to its text as they come)
        one, kept = calls_text(0)
    if NAMES[0] not in one:
        return None  # (below, solo: a call with two arguments, alone)
    two, solo = calls_text(0, 1)[0], calls_text(1)[0]
    syntax = _learn_calls(one, two if NAMES[1] in two else "", solo if NAMES[1] in solo else "")
    from infer.runtime.tool_harmony import harmony_order  # (the header's other order, where it has one)

    if syntax is not None:
        prompted, lead = prompted_lead(rendered, syntax.section_open + syntax.call_open)
        syntax = harmony_order(dataclasses.replace(syntax, content_first=kept, string_arguments=strings,
                                                   prompted=prompted, content_lead=lead))
    if syntax is None or builtin or "builtin_tools" not in source or syntax.alternate is not None:
        return syntax  # (else the form of its built-in tools is the alternate)
    other = learn(source, bos_token=bos_token, eos_token=eos_token, builtin=True)
    return ToolSyntax(**{**syntax.__dict__, "alternate": other}) if other not in (None, syntax) else syntax


def _json_at(text: str, start: int) -> tuple[Any, int] | None:
    try:
        return json.JSONDecoder().raw_decode(text, start)
    except ValueError:
        return None


def _find_json(text: str, wanted: Any, start: int = 0) -> tuple[int, int] | None:
    """The span of the first JSON value in `text` (from `start`) equal to `wanted`."""
    for m in re.finditer(r"[{\[]", text[start:]):
        found = _json_at(text, start + m.start())
        if found is not None and found[0] == wanted:
            return start + m.start(), found[1]
    return None


def _find_call_object(text: str, i: int, start: int = 0) -> tuple[int, int, dict[str, Any]] | None:
    """A JSON object in `text` that holds call `i`'s name and arguments."""
    for m in re.finditer(r"\{", text[start:]):
        found = _json_at(text, start + m.start())
        if found is None or not isinstance(found[0], dict):
            continue
        obj = found[0]
        if obj == {NAMES[i]: ARGS[i]} or (NAMES[i] in obj.values() and ARGS[i] in obj.values()):
            return start + m.start(), found[1], obj
    return None


@dataclass
class _Call:
    start: int  # where the call's own text begins (its name, or its JSON object)
    end: int  # where its arguments end
    name_close: str = ""  # between the name and the arguments
    obj: dict[str, Any] | None = None  # the whole call as one JSON object
    spans: tuple[tuple[int, int, int, int], ...] = ()  # each key's and value's span (pairs)


def _locate(text: str, i: int, start: int = 0) -> _Call | None:
    """Call `i` in `text`, from `start`."""
    found = _find_call_object(text, i, start)
    at = text.find(NAMES[i], start)
    if found is not None and (at < 0 or found[0] <= at):
        return _Call(found[0], found[1], obj=found[2])
    if at < 0:
        return None
    after = at + len(NAMES[i])
    args = _find_json(text, ARGS[i], after)
    if args is not None:
        return _Call(at, args[1], name_close=text[after:args[0]])
    pos, spans = after, []
    for key, value in ARGS[i].items():
        written = value if isinstance(value, str) else json.dumps(value)
        k = text.find(key, pos)
        v = text.find(written, k + len(key)) if k >= 0 else -1
        if v < 0:
            return None
        spans.append((k, k + len(key), v, v + len(written)))
        pos = v + len(written)
    return _Call(at, pos, spans=tuple(spans))


def _suffix_in(text: str, of: str) -> str:
    """The longest end of `of` that `text` ends with."""
    n = len(os.path.commonprefix([text[::-1], of[::-1]]))  # noqa: RUF071 (text, not paths)
    return of[len(of) - n:] if n else ""


def _prefix_in(text: str, of: str) -> str:
    return of[:len(os.path.commonprefix([text, of]))]  # noqa: RUF071


def _split(junction: str, before: str, after: str) -> tuple[str, str, str]:
    """`junction` (what stands between two items) as (the end of one item, a separator, the
    start of the next), where an item starts as `before` ends and ends as `after` starts; of
    the ways to cut it, one whose cuts fall between markers."""
    ways = []
    for n in range(len(_suffix_in(junction, before)), -1, -1):
        start = junction[len(junction) - n:]
        end = _prefix_in(junction[:len(junction) - n], after)
        cuts = clean(junction, len(end)) + clean(junction, len(junction) - n)
        ways.append((cuts, n, end, start))
    _, _, end, start = max(ways)
    return end, junction[len(end):len(junction) - len(start)], start


def _learn_pairs(one: str, first: _Call, solo: str) -> tuple[Pairs, str, int] | None:
    """The key/value markers from the one-argument call and the two-argument one (`solo`):
    the pairs, the name's closing text and where the first call's arguments end."""
    second = _locate(solo, 1) if solo else None
    if second is None or len(second.spans) != 2 or len(first.spans) != 1:
        return None
    (k, k_end, v, v_end), = first.spans
    head, after_key, rest = one[first.start + len(NAMES[0]):k], one[k_end:v], one[v_end:]
    (_, kb_end, vb, vb_end), (kc, kc_end, vc, vc_end) = second.spans
    if solo[kb_end:vb] != after_key:
        return None
    after_value, sep, before_key = _split(solo[vb_end:kc], head, rest)
    tail = rest[len(after_value):]
    rest_other = solo[vc_end:]
    after_value_other = rest_other[:len(rest_other) - len(tail)] if rest_other.endswith(tail) else after_value
    pairs = Pairs(before_key, {"string": after_key, "other": solo[kc_end:vc]},
                  {"string": after_value, "other": after_value_other}, sep)
    return pairs, head[:len(head) - len(before_key)], v_end + len(after_value)


def _numbered(first: str, second: str) -> tuple[str, int] | None:
    """`first` with the call's number as INDEX, where `second` (the next call's) differs from
    it by that number alone; None where they differ otherwise."""
    if first == second:
        return first, 0
    head = len(os.path.commonprefix([first, second]))  # noqa: RUF071
    while head and first[head - 1].isdigit():
        head -= 1
    a, b = re.match(r"\d+", first[head:]), re.match(r"\d+", second[head:])
    if a is None or b is None or int(b.group()) != int(a.group()) + 1:
        return None
    if first[head + a.end():] != second[head + b.end():]:
        return None
    return first[:head] + INDEX + first[head + a.end():], int(a.group())


def _extras(obj: dict[str, Any], other: dict[str, Any] | None, keys: tuple[str, str]) -> tuple[
        tuple[tuple[str, Any], ...], int]:
    """A JSON call's keys besides the name and arguments: a constant, the call's id (ID) or its
    number (INDEX, as the first call's base)."""
    out, base = [], 0
    for key, value in obj.items():
        if key in keys or keys == ("", ""):
            continue
        if value == ID:
            out.append((key, ID))
        elif other is not None and str(value).isdigit() and str(other.get(key)) == str(int(value) + 1):
            out.append((key, INDEX if isinstance(value, int) else INDEX + "s"))
            base = int(value)
        else:
            out.append((key, value))
    return tuple(out), base


def _name_close(text: str, call: _Call, name: str, pairs: Pairs | None) -> str:
    if pairs is None:
        return call.name_close
    head = text[call.start + len(name):call.spans[0][0]]
    return head[:len(head) - len(pairs.before_key)]


def _json_keys(obj: dict[str, Any]) -> tuple[str, str]:
    if obj == {NAMES[0]: ARGS[0]}:
        return "", ""
    name = next(k for k, v in obj.items() if v == NAMES[0])
    return name, next(k for k, v in obj.items() if v == ARGS[0])


def _learn_calls(one: str, two: str, solo: str) -> ToolSyntax | None:
    first = _locate(one, 0)
    if first is None:
        return None
    pairs, index_base, extras, keys = None, 0, (), None
    name_close, end = first.name_close, first.end
    if first.spans:
        learned = _learn_pairs(one, first, solo)
        if learned is None:
            return None
        pairs, name_close, end = learned
    pre, post = one[:first.start], one[end:]
    a = _locate(two, 0) if two else None
    b = _locate(two, 1, a.end) if a is not None else None
    if a is None or b is None or bool(a.obj) != bool(first.obj):
        keys = None if first.obj is None else _json_keys(first.obj)
        order = tuple(first.obj) if first.obj is not None else ()
        return ToolSyntax(pre, "", name_close, "", "", post, keys, json_order=order, pairs=pairs,
                          parallel=False)
    a_end = a.end + (len(pairs.after_value["string"]) if pairs else 0)
    b_end = b.end + (len(pairs.after_value["other"]) if pairs else 0)
    call_close, call_sep, call_open = _split(two[a_end:b.start], pre, post)
    if first.obj is not None:
        keys = _json_keys(first.obj)
        extras, index_base = _extras(a.obj or {}, b.obj, keys)
    else:
        numbered = _numbered(*(_name_close(two, c, NAMES[i], pairs) for i, c in enumerate((a, b))))
        if numbered is None or (pairs and two[b_end:] != post):
            return None
        name_close, index_base = numbered
    order = tuple(first.obj) if first.obj is not None else ()
    return ToolSyntax(pre[:len(pre) - len(call_open)], call_open, name_close, call_close, call_sep,
                      post[len(call_close):], keys, extras, order, pairs, index_base)
