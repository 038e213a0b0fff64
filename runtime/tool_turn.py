"""What an assistant turn's tool calls add to it, as a chat template renders the turn with
and without them (issue 33; runtime/tool_syntax.py takes the calls' text apart)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

_USER, _TEXT = "Q7f3", "A4m8"  # placeholders no template renders by itself


def turn_calls(rendered: Callable[..., str], calls: list[dict[str, Any]],
                empty: re.Pattern[str] | None) -> tuple[str, bool]:
    """The text `calls` add to an assistant turn (after a placeholder text), and whether the
    template keeps the turn's text with them. Where a turn with text shows no call
    (Gemma 4 writes calls only in a turn without text), a turn without text."""
    user = {"role": "user", "content": _USER}
    base, prompt = rendered([user, {"role": "assistant", "content": _TEXT}]), rendered([user], True)
    name = calls[0]["function"]["name"] if calls else ""
    added, kept = "", False
    for text in (_TEXT, ""):
        added, kept = _added(rendered([user, {"role": "assistant", "content": text, "tool_calls": calls}]),
                             base, prompt)
        if name in added:
            break
    lead = empty.match(added) if empty is not None else None
    return (added[lead.end():] if lead else added), kept


def empty_block(source: str, bos_token: str, eos_token: str) -> re.Pattern[str] | None:
    """An empty reasoning block the template writes before a reply's calls (Command R7B's
    ``<|START_THINKING|><|END_THINKING|>``): not part of the calls."""
    from infer.runtime.reasoning import detect

    fmt = detect(source, bos_token=bos_token, eos_token=eos_token)
    if fmt is None or not fmt.open:
        return None
    return re.compile(r"\s*" + re.escape(fmt.open) + r"\s*" + re.escape(fmt.close) + r"\s*")


def clean(text: str, at: int) -> bool:
    """Whether `at` falls between two markers or lines rather than inside one."""
    return at <= 0 or at >= len(text) or text[at - 1] in ">]\n" or text[at] in "<[\n"


def _added(text: str, base: str, prompt: str) -> tuple[str, bool]:
    """What an assistant turn's calls add to it (`text`), and whether its text is kept before
    them: after the turn's text where it is kept, else after the generation prompt or what the
    turn without calls has before its text; without the turn's end."""
    if not text or _TEXT not in base:
        return "", False
    end = base[base.index(_TEXT) + len(_TEXT):]
    if _TEXT in text:
        added, kept = text[text.index(_TEXT) + len(_TEXT):], True
    else:  # (the text is dropped: after what the turn has in common with one without calls)
        start = text.find(_USER) + len(_USER) if _USER in text else 0
        header = start + len(os.path.commonprefix([text[start:], base[base.find(_USER) + len(_USER):]]))  # noqa: RUF071
        while not clean(text, header):
            header -= 1
        added, kept = text[header:], False
    cut = len(added) - len(os.path.commonprefix([added[::-1], end[::-1]]))  # noqa: RUF071 (the turn's end)
    while not clean(added, cut):
        cut += 1
    added = added[:cut]
    tail = prompt[prompt.index(_USER) + len(_USER):] if _USER in prompt else ""
    if tail.strip() and tail.strip() in added:  # calls in a turn of their own: after its header
        return added[added.rindex(tail.strip()) + len(tail.strip()):], False  # (gpt-oss)
    if end.strip() and end.strip() in added:  # (Nemotron: a header of its own)
        turn = added[added.index(end.strip()) + len(end.strip()):].lstrip()
        return _after_header(turn, end.strip(), tail), False
    return added, kept


def _after_header(turn: str, end: str, prompt: str) -> str:
    """A turn's text after the header the generation prompt writes for it."""
    header = prompt[prompt.index(end) + len(end):].lstrip() if end in prompt else prompt.lstrip()
    if header and turn.startswith(header):
        return turn[len(header):]
    at = len(os.path.commonprefix([turn, header]))  # noqa: RUF071 (text, not paths)
    while not clean(turn, at):
        at -= 1
    return turn[at:]


def prompted_lead(rendered: Callable[..., str], opening: str) -> tuple[str, str]:
    """Where the generation prompt already writes the start of the calls' `opening`
    (functionary v3.2's ``>>>``, after which a reply writes ``NAME\\n{…}`` for a call or
    ``all\\n`` and its text): that part, and what a turn of text alone writes after it before
    its text ("" and "" where the prompt writes none of the opening)."""
    user = {"role": "user", "content": _USER}
    prompt = rendered([user], True)
    n = max((n for n in range(1, len(opening) + 1) if prompt.endswith(opening[:n]) and clean(opening, n)),
            default=0)
    if not opening[:n].strip():
        return "", ""
    base = rendered([user, {"role": "assistant", "content": _TEXT}])
    lead = base[len(prompt):base.find(_TEXT, len(prompt))] if base.startswith(prompt) else ""
    return opening[:n], lead if _TEXT not in lead else ""
