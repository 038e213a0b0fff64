"""Tool calls (issue 33): each chat template's call syntax learned from what it renders, and a
reply in that syntax read back into the same calls, whole and fed in every way it may be cut,
with the text before them as content and no marker in it."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from tiny_model import fixtures_dir

from infer.runtime.tool_generic import written
from infer.runtime.tool_grammar import trigger_pattern
from infer.runtime.tool_stream import ArgumentsPiece, CallStarted, ToolCallStream
from infer.runtime.tool_syntax import learn

HERE = Path(__file__).parent / "chat_templates"

# Templates that write calls, by their files' names (shared fixtures, then tests/chat_templates)
WITH_CALLS = (
    "Apriel-1.6-15b-Thinker-fixed", "ByteDance-Seed-OSS", "CohereForAI-c4ai-command-r7b-12-2024-tool_use",
    "GLM-4.7-Flash", "GigaChat3-10B-A1.8B", "GigaChat3.1-10B-A1.8B", "Kimi-K3", "LFM2.5-8B-A1B", "MiMo-VL",
    "MiniMax-M2", "Mistral-Small-3.2-24B-Instruct-2506", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
    "Qwen-QwQ-32B", "Qwen-Qwen2.5-7B-Instruct", "Qwen-Qwen3-0.6B", "Qwen3-Coder", "Reka-Edge", "Spark2.5",
    "StepFun3.5-Flash", "deepseek-ai-DeepSeek-V3.1", "deepseek-ai-DeepSeek-V3.2", "deepseek-ai-DeepSeek-V4",
    "deepseek-ai-DeepSeek-V4-Flash-0731", "google-gemma-4-31B-it", "meta-llama-Llama-3.2-3B-Instruct",
    "meta-llama-Llama-3.3-70B-Instruct", "mistralai-Ministral-3-14B-Reasoning-2512",
    "mistralai-Mistral-Nemo-Instruct-2407", "moonshotai-Kimi-K2", "openbmb-MiniCPM5-1B",
    "poolside-Laguna-S-2.1", "poolside-Laguna-XS-2.1", "poolside-Laguna-XS.2",
    "unsloth-mistral-Devstral-Small-2507", "Kimi-K2-Thinking", "llama-cpp-deepseek-r1",
    # tests/chat_templates
    "openai-gpt-oss-120b", "Qwen3.5-4B", "NVIDIA-Nemotron-Nano-v2", "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
    "tencent-Hy3", "ibm-granite-granite-4.0", "meta-llama-Llama-3.1-8B-Instruct", "upstage-Solar-Open-100B",
    "meetkai-functionary-medium-v3.1", "GLM-4.6", "Cohere2MoE", "Apertus-8B-Instruct", "unsloth-Apriel-1.5",
    "MiniMax-M1", "meetkai-functionary-medium-v3.2",
)
WITHOUT_CALLS = ("google-gemma-2-2b-it", "microsoft-Phi-3.5-mini-instruct", "LFM2.5-Instruct")


def _template(name: str) -> str:
    mine = HERE / f"{name}.jinja"
    return (mine if mine.exists() else fixtures_dir() / "chat-templates" / f"{name}.jinja").read_text("utf-8")


def _tool(name: str, **types: str) -> dict:
    props = {k: {"type": t} for k, t in types.items()}
    return {"type": "function", "function": {"name": name, "description": f"{name}.",
                                             "parameters": {"type": "object", "properties": props}}}


TOOLS = [_tool("get_weather", city="string", days="integer"),
         _tool("search", query="string", limit="integer", exact="boolean", tags="array")]
CALLS = [("get_weather", {"city": "Paris, France", "days": 3}),
         ("search", {"query": 'a "quoted" word\nover two lines', "limit": 5, "exact": True,
                     "tags": ["x", "y"]})]


def _openai(calls: list) -> list[dict]:
    return [{"id": f"call{n}abcd", "type": "function", "function": {"name": name, "arguments": args}}
            for n, (name, args) in enumerate(calls)]


def _read(syntax, pieces: list[str]) -> tuple[str, list[tuple[str, dict]], list[str]]:
    """Content, calls (name, arguments) and ids, from `pieces` fed one after the other."""
    stream = ToolCallStream(syntax, TOOLS)
    content, names, args, ids = [], {}, {}, {}
    for event in [e for piece in pieces for e in stream.feed(piece)] + stream.finish():
        if isinstance(event, str):
            content.append(event)
        elif isinstance(event, CallStarted):
            assert event.index not in names and event.index == len(names)  # each call starts once, in order
            names[event.index], ids[event.index], args[event.index] = event.name, event.id, ""
        else:
            assert isinstance(event, ArgumentsPiece) and event.index in names
            args[event.index] += event.text
    calls = [(names[i], json.loads(args[i])) for i in sorted(names)]
    return "".join(content), calls, [ids[i] for i in sorted(ids)]


def _cuts(text: str, rng: random.Random, n: int = 10) -> list[list[str]]:
    out = [[text], list(text)]
    for _ in range(n):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 8))))
        out.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)])
    return out


@pytest.mark.parametrize("name", WITH_CALLS)
def test_a_reply_in_the_templates_syntax_reads_back_as_its_calls(name):
    source = _template(name)
    syntax = learn(source, bos_token="<s>", eos_token="</s>")
    assert syntax is not None
    calls = CALLS if syntax.parallel else CALLS[:1]
    text = written(source, TOOLS, _openai(calls), "Let me look that up.", bos_token="<s>", eos_token="</s>")
    for pieces in _cuts(text, random.Random(name)):
        content, got, ids = _read(syntax, pieces)
        assert got == calls, (pieces, text)
        assert content.strip() == ("Let me look that up." if syntax.content_first else ""), (pieces, text)
        assert len(set(ids)) == len(ids) and all(ids)


@pytest.mark.parametrize("name", WITHOUT_CALLS)
def test_a_template_that_writes_no_calls_has_no_syntax(name):
    assert learn(_template(name), bos_token="<s>", eos_token="</s>") is None


@pytest.mark.parametrize("name, text", [
    ("Qwen-Qwen3-0.6B", "Models write <tool_call> tags around their calls."),
    ("mistralai-Ministral-3-14B-Reasoning-2512", "The marker [TOOL_CALLS] starts a call."),
    ("deepseek-ai-DeepSeek-V3.1", "No calls here, just text."),
])
def test_text_that_only_looks_like_a_call_stays_content(name, text):
    syntax = learn(_template(name), bos_token="<s>", eos_token="</s>")
    for pieces in _cuts(text, random.Random(text)):
        assert _read(syntax, pieces) == (text, [], [])


def test_llama_built_in_tools_are_called_as_its_template_writes_them():
    """Llama 3.1-3.3: a request's tool the model knows as built in (brave_search) is named so
    in the system prompt, and its calls are written `<|python_tag|>NAME.call(key="value")` and
    end the message with <|eom_id|>: such a reply reads back as the call, whole or in pieces,
    also where the reply stops at the end token (its text not shown); other tools' calls are
    the template's JSON."""
    from infer.runtime.template import render
    from infer.runtime.tool_request import template_tools

    source = _template("meta-llama-Llama-3.3-70B-Instruct")
    syntax = learn(source, bos_token="<s>", eos_token="</s>")
    assert syntax is not None and syntax.alternate is not None
    tools = [_tool("brave_search", query="string", count="integer"), *TOOLS]
    # (the template adds the values to strings: each a string here)
    call = _openai([("brave_search", {"query": "weather in Paris", "count": "3"})])
    turn = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "", "tool_calls": call}]
    rendered = render(source, turn, variables=template_tools(tools, source))
    assert "Tools: brave_search\n" in rendered
    text = rendered[rendered.index("<|python_tag|>"):rendered.index("<|eom_id|>") + len("<|eom_id|>")]
    assert text.startswith("<|python_tag|>brave_search.call("), text
    for reply in (text, text.removesuffix("<|eom_id|>")):
        for pieces in _cuts(reply, random.Random(reply)):
            stream = ToolCallStream(syntax, tools)
            events = [e for piece in pieces for e in stream.feed(piece)] + stream.finish()
            assert [e for e in events if isinstance(e, str)] == [], pieces
            assert [(c.name, json.loads(c.arguments)) for c in stream.calls] == [
                ("brave_search", {"query": "weather in Paris", "count": 3})]
    assert "Tools:" not in render(source, turn[:1], variables=template_tools(TOOLS, source))
    json_call = written(source, TOOLS, _openai(CALLS[:1]))
    assert _read(syntax, [json_call])[1] == CALLS[:1]


def test_an_id_the_model_writes_is_the_calls_id():
    syntax = learn(_template("Mistral-Small-3.2-24B-Instruct-2506"), bos_token="<s>", eos_token="</s>")
    text = '[TOOL_CALLS]get_weather[CALL_ID]Zx9Yw8Vu7[ARGS]{"city": "Oslo"}'
    assert _read(syntax, [text])[2] == ["Zx9Yw8Vu7"]


def test_nothing_of_a_call_is_content_while_it_streams():
    """The opening marker held back while it may still be one; the name and the arguments out
    as soon as they are known."""
    syntax = learn(_template("Qwen-Qwen3-0.6B"), bos_token="<s>", eos_token="</s>")
    stream = ToolCallStream(syntax, TOOLS)
    assert stream.feed("Sure.\n<tool_") == ["Sure.\n"]
    assert stream.feed('call>\n{"name": "get_weather", "arguments": {"ci') == [
        CallStarted(0, stream.calls[0].id, "get_weather"), ArgumentsPiece(0, '{"ci')]
    assert stream.feed('ty": "Rome"}}\n</tool_call>') == [ArgumentsPiece(0, 'ty": "Rome"}')]
    assert stream.finish() == []


def test_gpt_oss_calls_in_harmony_order_after_its_analysis():
    """gpt-oss writes a call after its reasoning as harmony puts a header (channel, then
    recipient, then `<|constrain|>` and the content type), not as its template writes an earlier
    call (recipient first): the reasoning ends at the new turn, and the call is read in either
    order, cut anywhere; a final answer after the reasoning is the answer, its header left out."""
    from infer.runtime.reasoning import ReasoningSplitter, detect

    source = _template("openai-gpt-oss-120b")
    syntax = learn(source, bos_token="<|startoftext|>", eos_token="<|return|>")
    fmt = detect(source, bos_token="<|startoftext|>", eos_token="<|return|>")
    args = json.dumps(CALLS[0][1])
    for header in (f"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{args}",
                   f" to=functions.get_weather<|channel|>commentary json<|message|>{args}"):
        text = f"<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant{header}<|call|>"
        for pieces in _cuts(text, random.Random(header)):
            split = ReasoningSplitter(fmt, inside=False)
            answer = "".join(split.feed(p)[1] for p in pieces) + split.finish()[1]
            assert split.reasoning == "Need the weather." and _read(syntax, [answer])[:2] == ("", CALLS[:1])
    split = ReasoningSplitter(fmt, inside=False)
    final = split.feed("<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant"
                       "<|channel|>final<|message|>Hi!")
    assert (split.reasoning, final[1] + split.finish()[1]) == ("Easy.", "Hi!")


def test_functionary_v32_replies_begin_after_the_prompts_opening():
    """functionary v3.2's generation prompt ends with ">>>", which begins each call: a reply is
    "all\\n" and its text (the lead is not content), or a call's name at once, and text may go
    on to calls; its template adds an earlier call's arguments to its text as the JSON string
    they are. The `auto` trigger fires at a name at the reply's start or after ">>>", not at a
    name in text."""
    syntax = learn(_template("meetkai-functionary-medium-v3.2"), bos_token="<s>", eos_token="</s>")
    assert (syntax.prompted, syntax.content_lead, syntax.string_arguments) == (">>>", "all\n", True)
    weather = 'get_weather\n{"city": "Paris, France", "days": 3}'
    cases = {"all\nIt is sunny.": ("It is sunny.", []), "It is sunny.": ("It is sunny.", []),
             weather: ("", CALLS[:1]), "all\nLet me look.>>>" + weather: ("Let me look.", CALLS[:1])}
    for text, (content, calls) in cases.items():
        for pieces in _cuts(text, random.Random(text)):
            got = _read(syntax, pieces)
            assert (got[0].strip(), got[1]) == (content, calls), pieces
    pattern = re.compile(trigger_pattern(syntax, TOOLS))
    assert [pattern.fullmatch(t).start(1) for t in ("get_weather\n{", "all\nHi>>>search\n{")] == [0, 9]
    assert pattern.fullmatch("all\nHi, get_weather\n{") is None and pattern.fullmatch("all\n") is None
