"""A thinking model's reasoning: its markers, learned from the chat template, and a streaming
splitter that separates the reasoning from the answer (issue 32).

The markers come from what the template renders, never from a model's name, so a template
never seen before that follows a known convention works:

1. An assistant turn with reasoning (``reasoning_content``, also given as ``thinking`` and
   ``reasoning``; last, as a "thinking" chunk of its content: Mistral's) rendered after a
   user turn: the text
   between the reasoning and the answer is the closing marker (``</think>``,
   ``</seed:think>``, ``[BEGIN FINAL RESPONSE]``...), and the opening one is its conventional
   pair where the rendering has it before the reasoning (``<think>``), else what the reply
   writes before its reasoning after the generation prompt (gpt-oss's channel header), else
   what the turn has between its header and the reasoning (possibly nothing).
2. Where the template does not render reasoning in a history, the generation prompt tells:
   with the template's switches on (``enable_thinking``, ``thinking``) it ends with an
   opening marker, and off (or by default) with that marker and the closing one after it
   (DeepSeek V3.1's ``<think></think>``), or with the closing one alone (DeepSeek V4's); or it
   ends with a marker whose conventional closing is known (R1 distills' ``<think>\\n``);
   or a history whose replies carry an empty block (Kimi K2 Thinking's ``<think></think>``).
3. A switch that only adds an instruction (Granite 3.3's system prompt with ``thinking``: "Write
   your thoughts between <think></think> and write your response between
   <response></response>"): an empty conventional pair in the text the switch adds gives the
   markers, and a second empty pair there wraps the answer (taken off it, as llama-server does).

Whether the reply starts inside the block (the generation prompt already opened it) or the
block is closed in the prompt (thinking off) is read from the generation prompt too.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infer.runtime.template import render

_Q, _R, _A = "Q7f3", "R9k2", "A4m8"  # placeholders no template renders by itself
SWITCHES_ON = {"enable_thinking": True, "thinking": True}
SWITCHES_OFF = {"enable_thinking": False, "thinking": False}

# Conventional pairs: a closing marker's opening one.
_PAIRS = (
    (re.compile(r"^</([^<>\s]+)>$"), r"<\1>"),  # </think> -> <think>, </seed:think>
    (re.compile(r"^\[/([^\[\]\s]+)\]$"), r"[\1]"),  # [/THINK] -> [THINK]
    (re.compile(r"^<\|END_([A-Z_]+)\|>$"), r"<|START_\1|>"),  # Command's <|END_THINKING|>
)
# Opening markers whose closing one is conventional, as a generation prompt may end with them.
_OPENERS = (
    (re.compile(r"<(think|thinking|seed:think)>"), r"</\1>"),
    (re.compile(r"\[(THINK)\]"), r"[/\1]"),
    (re.compile(r"<\|START_(THINKING)\|>"), r"<|END_\1|>"),
    (re.compile(r"<\|channel>thought"), "<channel|>"),  # Gemma 4's
)


@dataclass(frozen=True)
class ReasoningFormat:
    """How a model marks its reasoning: `open` (may be "": the generation prompt alone opens
    it) and `close`, whether a reply starts inside the block with the template's default
    switches (`starts_open`), and the markers around the answer where it has them."""

    open: str
    close: str
    starts_open: bool = False
    answer_open: str = ""  # a wrapper around the answer, left out of it (Granite's <response>)
    answer_close: str = ""

    def starts_open_with(self, generation_prompt: str) -> bool | None:
        """For a prompt rendered with some switches: True if the reply starts inside the block,
        False if the prompt closed an empty block (thinking off), None if neither."""
        tail = generation_prompt.rstrip()
        if self.close and tail.endswith(self.close):
            return False
        return True if (not self.open and tail) or (self.open and tail.endswith(self.open.rstrip())) else None


@functools.lru_cache(maxsize=64)  # (a server asks for every request; a template's answer never changes)
def detect(source: str, *, bos_token: str = "", eos_token: str = "") -> ReasoningFormat | None:
    """The reasoning convention of the chat template `source`, or None if it has none."""

    def rendered(messages: list[dict[str, str]], generation: bool, variables: Mapping[str, Any] = {}) -> str:
        try:
            return render(source, messages, bos_token=bos_token, eos_token=eos_token,
                          add_generation_prompt=generation, variables=variables)
        except Exception:  # (a template that refuses this probe says nothing about reasoning)
            return ""

    user = [{"role": "user", "content": _Q}]
    prompts = {name: rendered(user, True, switches) for name, switches in
               (("default", {}), ("on", SWITCHES_ON), ("off", SWITCHES_OFF))}
    answered = [*user, {"role": "assistant", "content": _A, "reasoning_content": _R, "thinking": _R,
                        "reasoning": _R}]
    plain = [*user, {"role": "assistant", "content": _A}]
    # (Mistral's reasoning models take it as a "thinking" chunk of the content)
    chunked = [*user, {"role": "assistant", "content": [{"type": "thinking", "thinking": _R},
                                                        {"type": "text", "text": _A}]}]
    history = rendered(answered, False), rendered(plain, False)
    found = (_from_history(*history, prompts["on"] or prompts["default"])
             or _from_prompts(prompts["default"], prompts["on"], prompts["off"])
             or _from_empty_block(history[1])
             or _from_history(rendered(chunked, False), history[1], "", paired=True))
    wrapper = ("", "")
    if found is None:
        found, wrapper = _from_switch_text(prompts["on"], prompts["off"] or prompts["default"])
    if found is None:
        return None
    opener, closer = found
    if not any(wrapper):
        closer, wrapper = _new_turn(closer, _after_user(prompts["default"]).strip())
    fmt = ReasoningFormat(opener, closer)
    return ReasoningFormat(opener, closer, bool(fmt.starts_open_with(_after_user(prompts["default"]))),
                           *wrapper)


def _new_turn(closer: str, header: str) -> tuple[str, tuple[str, str]]:
    """Where the reasoning ends its turn and the answer is a new assistant turn (`header`, what
    the generation prompt writes after the user's turn) that goes on to a header of its own
    (gpt-oss: "<|end|><|start|>assistant" then "<|channel|>final<|message|>"): the reasoning
    ends with that turn's header, and the rest is the answer's wrapper. A reply may then go on
    in another channel instead (gpt-oss' tool calls: "<|channel|>commentary to=functions...")."""
    if header and closer.startswith(header) and closer[len(header):].strip():
        return header, (closer[len(header):], "")
    return closer, ("", "")


def _after_user(prompt: str) -> str:
    return prompt[prompt.find(_Q) + len(_Q):] if _Q in prompt else ""


def _from_history(with_reasoning: str, without: str, prompt: str, *,
                  paired: bool = False) -> tuple[str, str] | None:
    """The markers around the reasoning of an answered turn; `paired`: only a conventional pair
    (where a template may print what it does not know, a list of chunks, as text)."""
    r, a = with_reasoning.find(_R), with_reasoning.find(_A)
    if r < 0 or a < r:
        return None
    closer = with_reasoning[r + len(_R):a].strip()
    if not closer:
        return None
    before = with_reasoning[:r].rstrip()
    for pattern, opening in _PAIRS:
        if pattern.match(closer):
            opener = pattern.sub(opening, closer)
            if before.endswith(opener):
                return opener, closer
    if paired:
        return None
    # The opening marker: what the reply writes before its reasoning, after the generation
    # prompt (gpt-oss's "<|channel|>analysis<|message|>" after "<|start|>assistant"), else after
    # the header the turn has with and without reasoning.
    start = len(prompt) if prompt and with_reasoning.startswith(prompt) else \
        len(os.path.commonprefix([with_reasoning, without]))  # noqa: RUF071 (text, not paths)
    return with_reasoning[min(start, r):r].strip(), closer


def _from_prompts(default: str, on: str, off: str) -> tuple[str, str] | None:
    """A conventional opening marker that a generation prompt ends with, open or closed again
    right after (thinking off), with the template's switches on, by default or off."""
    for prompt in (on, default, off):
        tail = _after_user(prompt).rstrip()
        for opening, closing in _OPENERS:
            for match in opening.finditer(tail):
                closer = match.expand(closing)
                if tail[match.end():].strip() in ("", closer):
                    return match.group(0), closer
    return None


def _from_empty_block(answered: str) -> tuple[str, str] | None:
    """A history whose replies carry an empty block before their answer (Kimi K2 Thinking's
    ``<think></think>`` where it drops the reasoning of earlier turns)."""
    before = answered[:answered.find(_A)].rstrip() if _A in answered else ""
    for opening, closing in _OPENERS:
        for match in opening.finditer(before):
            closer = match.expand(closing)
            if before[match.end():].strip() == closer:
                return match.group(0), closer
    return None


_EMPTY_PAIR = re.compile(r"<([A-Za-z][\w:-]*)></\1>|\[([A-Z_]+)\]\[/\2\]")


def _from_switch_text(on: str, off: str) -> tuple[tuple[str, str] | None, tuple[str, str]]:
    """The markers named by the text a thinking switch adds to the prompt (an instruction in
    the system prompt), and a second pair there that wraps the answer, as empty pairs."""
    if not on or not off or on == off:
        return None, ("", "")
    start = len(os.path.commonprefix([on, off]))  # noqa: RUF071 (text, not paths)
    end = len(os.path.commonprefix([on[start:][::-1], off[start:][::-1]]))  # noqa: RUF071
    added = on[start:len(on) - end]
    pairs = [(f"<{tag}>", f"</{tag}>") if (tag := m.group(1)) else (f"[{m.group(2)}]", f"[/{m.group(2)}]")
             for m in _EMPTY_PAIR.finditer(added)]
    thinking = [pair for pair in pairs if any(pattern.fullmatch(pair[0]) for pattern, _ in _OPENERS)]
    if not thinking:
        return None, ("", "")
    others = [pair for pair in pairs if pair != thinking[0]]
    return thinking[0], others[0] if others else ("", "")


class ReasoningSplitter:
    """Generated text in, (reasoning, answer) pieces out, as it streams: a marker split across
    pieces anywhere is recognised, and nothing of a marker reaches either side.

    `inside`: the reply starts inside the block (its generation prompt opened it). Otherwise
    a reply that opens with the opening marker (after blank space) thinks first; any other
    start is all answer. Blank space right after the closing marker is not part of the answer.
    """

    def __init__(self, fmt: ReasoningFormat, *, inside: bool, closed: bool = False, lead: str = "") -> None:
        self.fmt = fmt
        # `lead`: what the prompt wrote inside the block it opened, after the opening marker (R1's
        # "\n" after "<think>"): the reasoning begins with it, as llama-server's does
        self.lead = lead if inside else ""
        # `closed`: the prompt closed an empty block (thinking off): the answer comes at once
        self.state = "thinking" if inside else "after" if closed else "start"
        self.pending = ""  # text that may still be the start of a marker
        self.reasoning = self.answer = ""
        self.fed = 0  # characters fed
        self.answer_from: int | None = None  # where the answer began in what was fed

    def feed(self, text: str) -> tuple[str, str]:
        """The reasoning and the answer text that `text` makes final."""
        self.pending += text
        self.fed += len(text)
        reasoning, answer = self._advance(final=False)
        reasoning, self.lead = self.lead + reasoning, ""
        self.reasoning += reasoning
        self.answer += answer
        return reasoning, answer

    def finish(self) -> tuple[str, str]:
        reasoning, answer = self._advance(final=True)
        reasoning, self.lead = self.lead + reasoning, ""
        self.reasoning += reasoning
        self.answer += answer
        return reasoning, answer

    def _advance(self, *, final: bool) -> tuple[str, str]:
        reasoning: list[str] = []
        answer: list[str] = []
        while True:
            text = self.pending
            if self.state == "start":
                body = text.lstrip()
                if body.startswith(self.fmt.open) and self.fmt.open:
                    self.state, self.pending = "thinking", body[len(self.fmt.open):]
                    continue
                if self.fmt.open.startswith(body) and not final:
                    return "".join(reasoning), "".join(answer)  # still maybe the opening marker
                self.state = "wrap" if self.fmt.answer_open else "answer"
                continue
            if self.state == "thinking":
                at = text.find(self.fmt.close)
                if at >= 0:
                    reasoning.append(text[:at])
                    self.state, self.pending = "after", text[at + len(self.fmt.close):]
                    continue
                keep = 0 if final else _partial_suffix(text, self.fmt.close)
                reasoning.append(text[:len(text) - keep])
                self.pending = text[len(text) - keep:]
                return "".join(reasoning), "".join(answer)
            if self.state == "after":
                body = text.lstrip()
                if not body and not final:
                    self.pending = ""
                    return "".join(reasoning), "".join(answer)
                self.state, self.pending = "wrap" if self.fmt.answer_open else "answer", body
                continue
            if self.state == "wrap":  # an answer wrapper's opening marker (Granite's <response>)?
                body = text.lstrip()
                if body.startswith(self.fmt.answer_open):
                    self.state, self.pending = "wrapped", body[len(self.fmt.answer_open):].lstrip()
                    continue
                if self.fmt.answer_open.startswith(body) and not final:
                    return "".join(reasoning), "".join(answer)
                self.state = "answer"
                continue
            keep = 0
            if self.state == "wrapped":
                at = text.find(self.fmt.answer_close)
                if at >= 0:
                    self._take_answer(text[:at], answer)
                    self.state, self.pending = "answer", text[at + len(self.fmt.answer_close):]
                    continue
                keep = 0 if final else _partial_suffix(text, self.fmt.answer_close)
            self._take_answer(text[:len(text) - keep], answer)
            self.pending = text[len(text) - keep:]
            return "".join(reasoning), "".join(answer)

    def _take_answer(self, text: str, answer: list[str]) -> None:
        if self.answer_from is None:
            self.answer_from = self.fed - len(self.pending)
        answer.append(text)


def reasoning_tokens(token_bytes: Callable[[int], bytes], tokens: Sequence[int], text: str,
                     answer_from: int | None) -> int:
    """How many of `tokens` (whose text is `text`) came before the answer, which began at
    character `answer_from` (None: it never began: all of them)."""
    if answer_from is None:
        return len(tokens)
    wanted, seen = len(text[:answer_from].encode("utf-8")), 0
    for n, token in enumerate(tokens):
        if seen >= wanted:
            return n
        seen += len(token_bytes(token))
    return len(tokens)


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker`."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


THINK_LEVELS = ("on", "off", "low", "medium", "high")
_EFFORTS = ("low", "medium", "high")
_NO_SWITCH = "this chat template has no switch for thinking"


def think_variables(source: str, level: str, *, bos_token: str = "",
                    eos_token: str = "") -> tuple[dict[str, Any], str | None]:
    """The template variables that set thinking to `level` (--think) as the template `source`
    expects them, and what it cannot express (a line for -v), or None.

    A switch counts where setting it changes the generation prompt: `enable_thinking` and
    `thinking` (on/off), `reasoning_effort` (low/medium/high: gpt-oss's).
    """
    if level not in THINK_LEVELS:
        raise ValueError(level)

    def prompt(variables: Mapping[str, Any]) -> str:
        try:
            return render(source, [{"role": "user", "content": _Q}], bos_token=bos_token, eos_token=eos_token,
                          add_generation_prompt=True, variables=variables)
        except Exception:  # (a template that refuses a value does not take that switch)
            return ""

    booleans = [name for name in SWITCHES_ON if prompt({name: True}) != prompt({name: False})]
    on = dict.fromkeys(booleans, True)  # (a template may read the effort only with thinking on)
    effort = len({prompt({**on, "reasoning_effort": e}) for e in _EFFORTS}) > 1
    if level in _EFFORTS and effort:
        return {**on, "reasoning_effort": level}, None
    if level == "off":
        if booleans:
            return dict.fromkeys(booleans, False), None
        if effort:
            return {"reasoning_effort": "low"}, "this chat template cannot turn thinking off: effort low"
        return {}, f"{_NO_SWITCH}: --think off is not applied"
    if booleans:
        note = None if level == "on" else f"this chat template has no thinking levels: --think {level} is on"
        return dict.fromkeys(booleans, True), note
    if level == "on":
        return {}, None if effort else f"{_NO_SWITCH}: --think on is its default"
    return {}, f"{_NO_SWITCH}: --think {level} is not applied"
