"""Thinking models' reasoning (issue 32): the markers learned from real chat templates, the
streaming splitter fed in every split, and the controls and outputs of run, chat, batch and serve
on the embedded model under fixture templates."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from tiny_model import fixtures_dir

from infer.runtime.reasoning import ReasoningFormat, ReasoningSplitter, detect

THINK = ("<think>", "</think>")

# Template -> (open, close, starts_open), as each renders a reasoning turn or its generation prompt.
EXPECTED = {
    "Qwen-Qwen3-0.6B": (*THINK, False),  # the model opens the block itself
    "llama-cpp-deepseek-r1": (*THINK, True),  # the generation prompt ends with <think>
    "deepseek-ai-DeepSeek-V3.1": (*THINK, False),  # off by default: <think></think> in the prompt
    "deepseek-ai-DeepSeek-V4": (*THINK, False),  # off by default: </think> alone
    "GLM-4.7-Flash": (*THINK, True),
    "MiniMax-M2": (*THINK, True),
    "poolside-Laguna-XS-2.1": (*THINK, False),
    "ByteDance-Seed-OSS": ("<seed:think>", "</seed:think>", False),
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use": ("<|START_THINKING|>", "<|END_THINKING|>", False),
    "Apriel-1.6-15b-Thinker-fixed": ("", "[BEGIN FINAL RESPONSE]", True),  # "Here are my reasoning steps:"
    "HuggingFaceTB-SmolLM3-3B": (*THINK, False),
    "Kimi-K2-Thinking": (*THINK, False),  # earlier replies carry an empty <think></think>
    "google-gemma-4-31B-it": ("<|channel>thought", "<channel|>", False),  # off: the prompt closes it
    "mistralai-Ministral-3-14B-Reasoning-2512": ("[THINK]", "[/THINK]", False),  # a "thinking" chunk
}
NO_REASONING = ("Qwen-Qwen2.5-7B-Instruct", "meta-llama-Llama-3.2-3B-Instruct", "google-gemma-2-2b-it",
                "mistralai-Mistral-Nemo-Instruct-2407", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
                "meta-llama-Llama-3.3-70B-Instruct", "LFM2.5-Instruct", "Qwen3-Coder")


# Real templates of conventions the shared fixtures lack (tests/chat_templates/README.md)
MORE = {
    "ibm-granite-granite-3.3-2B-Instruct": (*THINK, False, "<response>", "</response>"),  # an instruction
    # (the reasoning ends its turn; the answer is a new turn whose header goes on to a wrapper)
    "upstage-Solar-Open-100B": ("<|think|>", "<|end|><|begin|>assistant", False, "<|content|>"),  # .reasoning
    "openai-gpt-oss-120b": ("<|channel|>analysis<|message|>", "<|end|><|start|>assistant", False,
                            "<|channel|>final<|message|>"),
    "Qwen3.5-4B": (*THINK, True),
    "NVIDIA-Nemotron-Nano-v2": (*THINK, True),
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": (*THINK, True),
    "tencent-Hy3": ("<think:opensource>", "</think:opensource>", False),
    "MiniMax-M3": ("<mm:think>", "</mm:think>", False),
}
MORE_WITHOUT = ("ibm-granite-granite-4.0", "meta-llama-Llama-3.1-8B-Instruct",
                "microsoft-Phi-3.5-mini-instruct", "meetkai-functionary-medium-v3.2")
HERE = Path(__file__).parent / "chat_templates"


def _template(name: str) -> str:
    mine = HERE / f"{name}.jinja"
    path = mine if mine.exists() else fixtures_dir() / "chat-templates" / f"{name}.jinja"
    return path.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", sorted({**EXPECTED, **MORE}))
def test_the_markers_come_from_what_the_template_renders(name):
    expected = ReasoningFormat(*{**EXPECTED, **MORE}[name])
    assert detect(_template(name), bos_token="<s>", eos_token="</s>") == expected


@pytest.mark.parametrize("name", NO_REASONING + MORE_WITHOUT)
def test_a_template_without_reasoning_is_left_alone(name):
    assert detect(_template(name), bos_token="<s>", eos_token="</s>") is None


def test_a_template_never_seen_that_follows_a_convention_is_recognised():
    made_up = ("{% for m in messages %}<<{{ m.role }}>>{% if m.reasoning_content %}[THINK]"
               "{{ m.reasoning_content }}[/THINK]{% endif %}{{ m.content }}{% endfor %}"
               "{% if add_generation_prompt %}<<assistant>>{% endif %}")
    assert detect(made_up) == ReasoningFormat("[THINK]", "[/THINK]", False)


def _splits(text: str, rng: random.Random) -> list[list[str]]:
    """The text whole, one character at a time, at every single cut, and at random cuts."""
    out = [[text], list(text)] + [[text[:i], text[i:]] for i in range(1, len(text))]
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 6))))
        out.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)])
    return out


GRANITE = ReasoningFormat(*THINK, False, "<response>", "</response>")  # the answer wrapped
HARMONY_OPEN = "<|channel|>analysis<|message|>"  # gpt-oss's reasoning, and its answer after it
HARMONY_CLOSE = "<|end|><|start|>assistant<|channel|>final<|message|>"
HARMONY_TURN, HARMONY_FINAL = "<|end|><|start|>assistant", "<|channel|>final<|message|>"
HARMONY_CALL = '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": 1}'
# (format, the reply starts inside the block, the generated text, reasoning, answer)
CASES = [
    (ReasoningFormat(*THINK), False, "<think>\nThe sky scatters blue.\n</think>\n\nRayleigh scattering.",
     "\nThe sky scatters blue.\n", "Rayleigh scattering."),
    (ReasoningFormat(*THINK, True), True, "Let me count: 6*7.\n</think>\n\n42", "Let me count: 6*7.\n", "42"),
    (ReasoningFormat(*THINK), False, "Hello! No thinking here.", "", "Hello! No thinking here."),
    (ReasoningFormat(*THINK), False, "<think></think>Closed at once, then <think> as text.", "",
     "Closed at once, then <think> as text."),
    (ReasoningFormat(*THINK), False, "<think>a</think>Write </think> to close a block.", "a",
     "Write </think> to close a block."),
    (ReasoningFormat("", "[BEGIN FINAL RESPONSE]", True), True,
     "1. look\n2. see\n[BEGIN FINAL RESPONSE]\nDone.", "1. look\n2. see\n", "Done."),
    (ReasoningFormat("<|START_THINKING|>", "<|END_THINKING|>"), False,
     "<|START_THINKING|>plan it<|END_THINKING|>the reply", "plan it", "the reply"),
    (ReasoningFormat(*THINK, True), True, "thinking that never ends <", "thinking that never ends <", ""),
    (ReasoningFormat(HARMONY_OPEN, HARMONY_CLOSE), False, f"{HARMONY_OPEN}User asks 2+2.{HARMONY_CLOSE}4",
     "User asks 2+2.", "4"),  # gpt-oss
    (ReasoningFormat(HARMONY_OPEN, HARMONY_TURN, False, HARMONY_FINAL), False,
     f"{HARMONY_OPEN}User asks 2+2.{HARMONY_TURN}{HARMONY_FINAL}4", "User asks 2+2.", "4"),  # (as detected)
    (ReasoningFormat(HARMONY_OPEN, HARMONY_TURN, False, HARMONY_FINAL), False,
     f"{HARMONY_OPEN}Call it.{HARMONY_TURN}{HARMONY_CALL}", "Call it.", HARMONY_CALL),  # a call after it
    (ReasoningFormat("<|channel>thought", "<channel|>"), False,
     "<|channel>thought\nSky: blue.<channel|>Blue.", "\nSky: blue.", "Blue."),  # Gemma 4
    (ReasoningFormat("[THINK]", "[/THINK]"), False, "[THINK]short[/THINK]Long answer.", "short",
     "Long answer."),  # Magistral
    (GRANITE, False, "<think>Sum it.</think>\n<response>It is 4.</response>", "Sum it.", "It is 4."),
    (GRANITE, False, "<response>No thoughts.</response>", "", "No thoughts."),
    (GRANITE, False, "Unwrapped, <response> as text.", "", "Unwrapped, <response> as text."),
]


@pytest.mark.parametrize("fmt, inside, text, reasoning, answer", CASES)
def test_the_splitter_gives_the_same_parts_however_the_text_is_cut(fmt, inside, text, reasoning, answer):
    rng = random.Random(text)
    for pieces in _splits(text, rng):
        splitter = ReasoningSplitter(fmt, inside=inside)
        got_r, got_a = [], []
        for piece in pieces:
            r, a = splitter.feed(piece)
            got_r.append(r)
            got_a.append(a)
        r, a = splitter.finish()
        got_r.append(r)
        got_a.append(a)
        assert ("".join(got_r), "".join(got_a)) == (reasoning, answer), pieces
        assert (splitter.reasoning, splitter.answer) == (reasoning, answer)


def test_the_reasoning_begins_with_what_the_prompt_wrote_inside_the_block():
    splitter = ReasoningSplitter(ReasoningFormat(*THINK, True), inside=True, lead="\n")
    assert splitter.feed("Hm") == ("\nHm", "")
    assert (*splitter.feed("m.</think>\n\nYes."), splitter.finish()) == ("m.", "Yes.", ("", ""))
    assert (splitter.reasoning, splitter.answer, splitter.answer_from) == ("\nHmm.", "Yes.", 14)


def test_no_part_of_a_marker_is_given_out_before_it_is_known():
    splitter = ReasoningSplitter(ReasoningFormat(*THINK), inside=False)
    assert splitter.feed("<th") == ("", "")
    assert splitter.feed("ink>idea</th") == ("idea", "")
    assert splitter.feed("ink>") == ("", "")
    assert splitter.feed("\n\nans") == ("", "ans")


def test_think_levels_use_the_switches_each_template_has():
    from infer.runtime.reasoning import think_variables

    qwen3 = _template("Qwen-Qwen3-0.6B")
    assert think_variables(qwen3, "off") == ({"enable_thinking": False}, None)
    assert think_variables(qwen3, "on") == ({"enable_thinking": True}, None)
    granite = _template("ibm-granite-granite-3.3-2B-Instruct")  # a system-prompt instruction
    assert think_variables(granite, "on") == ({"thinking": True}, None)
    assert think_variables(granite, "off") == ({"thinking": False}, None)
    variables, note = think_variables(qwen3, "high")  # no levels: on, said under -v
    assert variables == {"enable_thinking": True} and "--think high is on" in note
    effort = ("{{ messages[0].content }}{% if add_generation_prompt %}<|effort:{{ reasoning_effort | default"
              "('medium') }}|>{% endif %}")
    assert think_variables(effort, "high") == ({"reasoning_effort": "high"}, None)
    variables, note = think_variables(effort, "off")  # no off switch: the lowest effort, said
    assert variables == {"reasoning_effort": "low"} and "cannot turn thinking off" in note
    variables, note = think_variables(_template("Qwen-Qwen2.5-7B-Instruct"), "off")
    assert variables == {} and "no switch for thinking" in note


def test_think_off_renders_what_the_template_renders_for_it(smollm2):
    """`--think off` gives the prompt the template itself gives with its switch off (rendered
    here by plain Jinja), as `--chat-template-kwargs` does."""
    import jinja2
    from conftest import run_cli

    path = fixtures_dir() / "chat-templates" / "Qwen-Qwen3-0.6B.jinja"
    args = ["run", smollm2, "Hi", "--chat-template-file", path, "--show-prompt"]
    off = run_cli(*args, "--think", "off")
    assert off.returncode == 0, off.stderr
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    expected = env.from_string(path.read_text(encoding="utf-8")).render(
        messages=[{"role": "user", "content": "Hi"}], add_generation_prompt=True, enable_thinking=False)
    assert "<think>\n\n</think>" in expected
    assert off.stdout == expected + ("" if expected.endswith("\n") else "\n")
    kwargs = run_cli(*args, "--chat-template-kwargs", '{"enable_thinking": false}')
    assert kwargs.stdout == off.stdout
    on = run_cli(*args, "--think", "on")
    assert on.stdout != off.stdout and "</think>" not in on.stdout


def test_think_is_checked_and_said_where_it_cannot_apply(smollm2):
    from conftest import run_cli

    said = run_cli("run", smollm2, "Hi", "--think", "off", "-v", "--show-prompt")  # SmolLM2: no switch
    assert said.returncode == 0 and "no switch for thinking: --think off is not applied" in said.stderr
    chat = run_cli("chat", smollm2, "-v", "--think", "off", input="/think high\n/think bogus\n")
    assert chat.returncode == 0 and "--think off is not applied" in chat.stderr
    assert "--think high is not applied" in chat.stderr and "give one of on, off" in chat.stderr
    assert run_cli("chat", smollm2, "--think", "maybe", input="").returncode == 2
    for bad, words in ((["--think", "maybe"], "--think 'maybe': give one of on, off, low, medium, high"),
                       (["--chat-template-kwargs", "[1]"], "must be a JSON object"),
                       (["--chat-template-kwargs", "{"], "is not valid JSON"),
                       (["--raw", "--think", "on"], "--raw sends the prompt as is")):
        r = run_cli("run", smollm2, "Hi", *bad)
        assert r.returncode == 2 and words in r.stderr, (bad, r.stderr)



def _forced(text: str) -> str:
    """A grammar whose only sentence is `text` (it constrains the answer alone)."""
    import json

    return f"root ::= {json.dumps(text)}"


R1 = fixtures_dir() / "chat-templates" / "llama-cpp-deepseek-r1.jinja"  # its prompt opens the block
QWEN3 = fixtures_dir() / "chat-templates" / "Qwen-Qwen3-0.6B.jinja"  # the model may open it
# Under the R1 template the embedded model thinks (it never closes the block itself): a budget
# of 6 tokens closes it, and the grammar, which constrains the answer alone, writes the answer.
THOUGHT = ["--chat-template-file", R1, "--reasoning-budget", "6", "--grammar", _forced("The answer is 4."),
           "--temp", "0", "-n", "40", "--spec-type", "none"]


def test_run_prints_the_answer_and_keeps_the_reasoning_apart(smollm2):
    import json

    from conftest import run_cli

    args = ["run", smollm2, "What is 2+2?", *THOUGHT]
    plain = run_cli(*args)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout == "The answer is 4.\n"  # stdout: the answer alone
    result = json.loads(run_cli(*args, "--json").stdout)
    assert result["text"] == "The answer is 4." and result["reasoning"].strip()
    assert result["reasoning"] not in plain.stderr  # not a terminal: the reasoning is not printed
    shown = run_cli(*args, "--show-thinking")
    assert shown.stdout == plain.stdout and result["reasoning"].strip() in shown.stderr
    assert 6 <= result["usage"]["reasoning_tokens"] < result["usage"]["completion_tokens"]


def test_an_answer_wrapper_is_taken_off_the_answer(smollm2):
    """Granite 3.3 answers in <response>...</response> when its instruction asks it to think."""
    import json

    from conftest import run_cli

    granite = HERE / "ibm-granite-granite-3.3-2B-Instruct.jinja"
    r = run_cli("run", smollm2, "What is 2+2?", "--chat-template-file", granite, "--think", "on", "--json",
                "--grammar", _forced("<response>It is 4.</response>"), "--temp", "0", "-n", "20")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["text"] == "It is 4."


def test_markers_typed_in_the_prompt_never_count(smollm2):
    """The user's own </think> and <think> change nothing: the reply is split where the model
    (here the budget) wrote the markers; -v says how much of the reply was thinking."""
    import json

    from conftest import run_cli

    args = ["run", smollm2, "</think> What is 2+2? <think>", *THOUGHT]
    result = json.loads(run_cli(*args, "--json").stdout)
    assert result["text"] == "The answer is 4." and result["reasoning"].strip()
    assert "What is" not in result["reasoning"]
    said, usage = run_cli(*args, "-v").stderr, result["usage"]
    assert f"thinking: {usage['reasoning_tokens']} of the {usage['completion_tokens']} completion" in said


@pytest.mark.parametrize("template", [R1, QWEN3])
def test_a_json_schema_constrains_the_answer_after_the_reasoning(smollm2, template):
    """The schema holds for the answer, not the thinking: under R1's template the reply is
    reasoning first (closed by the budget), then JSON; under Qwen 3's the reply may open a
    block or answer at once, and the answer is JSON either way."""
    import json

    from conftest import run_cli

    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    result = json.loads(run_cli("run", smollm2, "What is 2+2? Answer in JSON.", "--chat-template-file",
                                template, "--reasoning-budget", "8", "--json-schema", json.dumps(schema),
                                "--temp", "0", "-n", "60", "--json").stdout)
    answer = json.loads(result["text"])
    assert isinstance(answer["answer"], int)
    if template == R1:
        assert result["reasoning"].strip() and result["usage"]["reasoning_tokens"] >= 8


def test_stop_strings_end_the_answer_not_the_reasoning(smollm2):
    """A stop string the model writes while thinking does not end the reply: it ends the answer."""
    import json

    from conftest import run_cli

    base = ["run", smollm2, "Why is the sky blue?", "--chat-template-file", R1, "--temp", "0", "-n", "40",
            "--reasoning-budget", "12", "--spec-type", "none", "--json"]
    whole = json.loads(run_cli(*base).stdout)
    word = next(w for w in whole["reasoning"].split() if f" {w} " in whole["text"])  # in both (" is ")
    stopped = json.loads(run_cli(*base, "--stop", f" {word} ").stdout)
    assert stopped["reasoning"] == whole["reasoning"] and stopped["finish_reason"] == "stop"
    assert stopped["text"] == whole["text"][:whole["text"].index(f" {word} ")]


def test_a_model_without_a_reasoning_convention_is_untouched(smollm2):
    import json

    from conftest import run_cli

    result = json.loads(run_cli("run", smollm2, "Hi", "-n", "4", "--temp", "0", "--json").stdout)
    assert "reasoning" not in result and "reasoning_tokens" not in result["usage"]


def test_a_reasoning_budget_closes_the_block_and_an_answer_follows(smollm2):
    """Under the R1 template (its prompt opens the block) the embedded model never closes it
    itself: with a budget, infer writes the closing marker and the answer follows; the budgeted
    reasoning is where the whole one began (greedy)."""
    import json

    from conftest import run_cli

    args = ["run", smollm2, "Why is the sky blue?", "--chat-template-file",
            fixtures_dir() / "chat-templates" / "llama-cpp-deepseek-r1.jinja", "--temp", "0", "-n", "40",
            "--spec-type", "none", "--json"]
    whole = json.loads(run_cli(*args).stdout)
    assert whole["text"] == "" and whole["reasoning"]  # no budget: thinking to the token limit
    budgeted = json.loads(run_cli(*args, "--reasoning-budget", "8").stdout)
    assert budgeted["text"].strip(), budgeted  # an answer follows the closed block
    assert budgeted["reasoning"] and whole["reasoning"].startswith(budgeted["reasoning"])
    assert 8 <= budgeted["usage"]["reasoning_tokens"] < budgeted["usage"]["completion_tokens"]
    none = json.loads(run_cli(*args, "--reasoning-budget", "0").stdout)
    assert none["reasoning"] == "" and none["text"].strip() and none["usage"]["reasoning_tokens"] == 0
    bad = run_cli("run", smollm2, "Hi", "--reasoning-budget", "-2")
    assert bad.returncode == 2 and "--reasoning-budget must be >= -1, got -2" in bad.stderr
    said = run_cli("run", smollm2, "Hi", "-n", "2", "--reasoning-budget", "5", "-v")
    assert said.returncode == 0
    assert "no reasoning convention: the reasoning budget is not applied" in said.stderr


def test_the_server_returns_the_reasoning_apart_as_infer_run_does(smollm2, tmp_path):
    """message.reasoning_content and content, streamed or not, are what `infer run --json`
    puts in reasoning and text, and usage.completion_tokens_details.reasoning_tokens its count."""
    import json

    import httpx
    from conftest import run_cli
    from serve_helpers import Server

    local = json.loads(run_cli("run", smollm2, "What is 2+2?", *THOUGHT, "--json").stdout)
    server = Server(str(smollm2), "-np", "1", "--chat-template-file", str(R1), "--no-socket",
                    "--spec-type", "none", home=tmp_path / "home")
    try:
        body = {"messages": [{"role": "user", "content": "What is 2+2?"}], "temperature": 0, "max_tokens": 40,
                "reasoning_budget": 6, "grammar": _forced("The answer is 4.")}
        whole = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120).json()
        message = whole["choices"][0]["message"]
        assert (message["content"], message["reasoning_content"]) == (local["text"], local["reasoning"])
        details = whole["usage"]["completion_tokens_details"]
        assert details["reasoning_tokens"] == local["usage"]["reasoning_tokens"]
        parts = {"content": "", "reasoning_content": ""}
        with httpx.stream("POST", server.url + "/v1/chat/completions", json={**body, "stream": True},
                          timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    for choice in json.loads(line[6:])["choices"]:
                        for key in parts:
                            parts[key] += choice["delta"].get(key) or ""
        assert (parts["content"], parts["reasoning_content"]) == (local["text"], local["reasoning"])
        # Through the server, `infer run` prints and reports what it does with the model loaded here.
        remote = ["run", smollm2, "What is 2+2?", "--server", server.url, "--reasoning-budget", "6",
                  "--grammar", _forced("The answer is 4."), "--temp", "0", "-n", "40"]
        there = json.loads(run_cli(*remote, "--json").stdout)
        assert (there["text"], there["reasoning"]) == (local["text"], local["reasoning"])
        assert there["usage"]["reasoning_tokens"] == local["usage"]["reasoning_tokens"]
        shown = run_cli(*remote, "--show-thinking")
        assert shown.stdout == "The answer is 4.\n" and local["reasoning"].strip() in shown.stderr
        assert local["reasoning"].strip() not in run_cli(*remote).stderr
        raw = httpx.post(server.url + "/v1/chat/completions", json={**body, "reasoning_format": "none"},
                         timeout=120).json()["choices"][0]["message"]
        assert "reasoning_content" not in raw  # reasoning_format none: the text as the model wrote it
        # (the reasoning begins with the "\n" the prompt wrote after its <think>, as llama-server's)
        assert "\n" + raw["content"] == local["reasoning"] + "</think>" + local["text"]
    finally:
        assert server.stop() == 0


def test_the_server_takes_the_thinking_settings_as_infer_run_does(smollm2, tmp_path):
    """think (Ollama's), reasoning_effort (OpenAI's) and chat_template_kwargs render what --think
    and --chat-template-kwargs render; an earlier reply's reasoning_content reaches a template
    that renders it; bad values are a 400 naming the field."""
    import json

    import httpx
    from conftest import run_cli
    from serve_helpers import Server

    def local(*flags: str) -> dict:
        return json.loads(run_cli("run", smollm2, "What is 2+2?", "--chat-template-file", QWEN3,
                                  "--temp", "0", "-n", "12", *flags, "--json").stdout)

    off, on = local("--think", "off"), local("--think", "on")
    assert off["usage"]["prompt_tokens"] != on["usage"]["prompt_tokens"]  # the template's switch
    server = Server(str(smollm2), "-np", "1", "--chat-template-file", str(QWEN3), "--no-socket",
                    home=tmp_path / "home")
    url = server.url + "/v1/chat/completions"
    try:
        base = {"messages": [{"role": "user", "content": "What is 2+2?"}], "temperature": 0, "max_tokens": 12}
        for extra, expected in (({"think": False}, off), ({"reasoning_effort": "none"}, off),
                                ({"chat_template_kwargs": {"enable_thinking": False}}, off),
                                ({"think": "on"}, on)):
            reply = httpx.post(url, json={**base, **extra}, timeout=120).json()
            assert reply["usage"]["prompt_tokens"] == expected["usage"]["prompt_tokens"], extra
            assert reply["choices"][0]["message"]["content"] == expected["text"], extra
        history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                   {"role": "user", "content": "What is 2+2?"}]
        thought = [history[0], {**history[1], "reasoning_content": "The user greets me."}, history[2]]
        plain, kept = (httpx.post(url, json={**base, "messages": m, "max_tokens": 1}, timeout=120).json()
                       for m in (history, thought))
        # (Qwen 3's template drops the reasoning of turns before the last question: the same prompt)
        assert plain["usage"]["prompt_tokens"] == kept["usage"]["prompt_tokens"]
        # (and renders it for a reply after the last question: there it is in the prompt)
        answered = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]
        reasoned = [answered[0], {**answered[1], "reasoning_content": "2+2 is 4."}]
        plain, kept = (httpx.post(url, json={**base, "messages": m, "max_tokens": 1}, timeout=120).json()
                       for m in (answered, reasoned))
        assert kept["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"]
        for bad, field in (({"think": "maybe"}, "think"), ({"reasoning_effort": "max"}, "reasoning_effort"),
                           ({"chat_template_kwargs": [1]}, "chat_template_kwargs"),
                           ({"reasoning_budget": -2}, "reasoning_budget"),
                           ({"reasoning_format": "xml"}, "reasoning_format")):
            r = httpx.post(url, json={**base, **bad}, timeout=120)
            assert r.status_code == 400 and r.json()["error"]["param"] == field, (bad, r.text)
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "think": True}, timeout=120)
        assert r.status_code == 400 and r.json()["error"]["param"] == "think"
    finally:
        assert server.stop() == 0


def test_chat_keeps_the_reasoning_apart_and_takes_think_and_budget(smollm2, infer_home, tmp_path):
    """`infer chat` shows the answer on stdout and the reasoning on stderr (--show-thinking), as
    `infer run` does, keeps it in /save, and /think and /set reasoning-budget change the next
    turn as the flags change a run; through a server the chat is the same."""
    import json

    from conftest import run_cli
    from serve_helpers import Server

    local = json.loads(run_cli("run", smollm2, "What is 2+2?", *THOUGHT, "--json").stdout)
    flags = ["--reasoning-budget", "6", "--grammar", _forced("The answer is 4."), "--temp", "0", "-n", "40",
             "--show-thinking", "--plain"]
    said = run_cli("chat", smollm2, "--chat-template-file", R1, "--spec-type", "none", *flags,
                   input="What is 2+2?\n/save thought\n")
    assert said.returncode == 0, said.stderr
    assert said.stdout == "The answer is 4.\n" and local["reasoning"].strip() in said.stderr
    saved = json.loads((infer_home / "sessions" / "thought" / "session.json").read_text())
    assert saved["messages"][-1] == {"role": "assistant", "content": "The answer is 4.",
                                     "reasoning_content": local["reasoning"]}
    server = Server(str(smollm2), "-np", "1", "--chat-template-file", str(R1), "--no-socket",
                    "--spec-type", "none", home=tmp_path / "home")
    try:
        there = run_cli("chat", smollm2, "--server", server.url, *flags, input="What is 2+2?\n")
        assert (there.stdout, there.returncode) == (said.stdout, 0)
        assert local["reasoning"].strip() in there.stderr
    finally:
        assert server.stop() == 0
    # /think off under Qwen 3's template: the next reply is the one `infer run --think off` gives
    run_off, run_on = (json.loads(run_cli("run", smollm2, "Name a colour.", "--chat-template-file", QWEN3,
                                          "--temp", "0", "-n", "8", *extra, "--json").stdout)
                       for extra in (["--think", "off"], []))
    turns = run_cli("chat", smollm2, "--chat-template-file", QWEN3, "--temp", "0", "-n", "8", "--plain",
                    input="Name a colour.\n/clear\n/think off\nName a colour.\n/save cold\n")
    assert turns.returncode == 0, turns.stderr
    assert turns.stdout.splitlines() == [run_on["text"], run_off["text"]]
    assert "think = 'off'" in turns.stderr
    # /save keeps the thinking settings, and /load (--session) takes them back
    saved = json.loads((infer_home / "sessions" / "cold" / "session.json").read_text())
    assert saved["thinking"]["think"] == "off"
    again = run_cli("chat", smollm2, "--chat-template-file", QWEN3, "--session", "cold", input="/think\n")
    assert (again.returncode, again.stdout) == (0, "think = off\n"), again.stderr


def test_on_a_terminal_the_reasoning_folds_into_one_line_when_the_answer_begins(monkeypatch):
    """The cursor goes back up exactly the rows the header and the reasoning took (a wrapped line
    counts its rows), and "thought for N s" replaces them; --show-thinking keeps them."""
    import io
    import os

    from infer.cli.thinking_display import thinking_display

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("shutil.get_terminal_size", lambda *a: os.terminal_size((10, 40)))
    out = Terminal()
    display = thinking_display({}, out=out)
    display.write("\nfirst line\nsecond line is long\nend")  # rows: header, 1, 2, and "end"
    display.end()
    assert "\x1b[4F\x1b[J" in out.getvalue() and "thought for" in out.getvalue()
    kept = Terminal()
    display = thinking_display({"show_thinking": True}, out=kept)
    display.write("reasoning")
    display.end()
    assert "\x1b[" not in kept.getvalue().replace("\x1b[2m", "").replace("\x1b[0m", "")
    assert "reasoning" in kept.getvalue() and "thought for" not in kept.getvalue()
    hidden = Terminal()
    thinking_display({"hide_thinking": True}, out=hidden).write("reasoning")
    assert hidden.getvalue() == ""


def test_batch_gives_each_line_its_reasoning_and_takes_think_and_budget_per_line(smollm2, tmp_path):
    """Each result line has `reasoning` and usage.reasoning_tokens as `infer run --json` has them;
    a line's own reasoning_budget (0: none) and think apply to it alone; a bad value fails that
    line; through a server the lines are the same."""
    import json

    from conftest import run_cli
    from serve_helpers import Server

    local = json.loads(run_cli("run", smollm2, "What is 2+2?", *THOUGHT, "--json").stdout)
    lines = [{"id": "a", "prompt": "What is 2+2?", "reasoning_budget": 6},
             {"id": "b", "prompt": "What is 2+2?", "reasoning_budget": 0},
             {"id": "c", "prompt": "What is 2+2?", "think": "maybe"}]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    flags = ["--grammar", _forced("The answer is 4."), "--temp", "0", "-n", "40"]

    def results(r) -> dict:
        assert r.returncode == 2, r.stderr  # (line c failed)
        return {d["id"]: d for d in map(json.loads, r.stdout.splitlines())}

    here = results(run_cli("batch", smollm2, source, "--chat-template-file", R1, "--spec-type", "none",
                           *flags))
    assert (here["a"]["text"], here["a"]["reasoning"]) == (local["text"], local["reasoning"])
    assert here["a"]["usage"]["reasoning_tokens"] == local["usage"]["reasoning_tokens"]
    assert (here["b"]["text"], here["b"]["reasoning"], here["b"]["usage"]["reasoning_tokens"]) == \
        ("The answer is 4.", "", 0)
    assert "think" in here["c"]["error"]
    server = Server(str(smollm2), "-np", "2", "--chat-template-file", str(R1), "--no-socket",
                    "--spec-type", "none", home=tmp_path / "home")
    try:
        there = results(run_cli("batch", smollm2, source, "--server", server.url, *flags))
    finally:
        assert server.stop() == 0
    for key in ("a", "b"):
        assert (there[key]["text"], there[key]["reasoning"]) == (here[key]["text"], here[key]["reasoning"])
    assert "think" in there["c"]["error"]


# A template of the harmony convention (gpt-oss's channels: the reasoning in an "analysis"
# message, the answer in a "final" one), written for the embedded model with its control tokens
# as the markers, and its generation prompt opening the analysis message.
HARMONY = """{%- for m in messages -%}
{%- if m.role == "user" -%}<|im_start|>user<jupyter_text>{{ m.content }}<|im_end|>
{%- elif m.role == "assistant" -%}<|im_start|>assistant<jupyter_code>
{%- if loop.last and not add_generation_prompt and m.thinking is defined -%}
analysis<jupyter_text>{{ m.thinking }}<jupyter_output><|im_start|>assistant<jupyter_code>
{%- endif -%}
final<jupyter_text>{{ m.content }}<|im_end|>
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}<|im_start|>assistant<jupyter_code>analysis<jupyter_text>{%- endif -%}"""


def test_markers_made_of_control_tokens_are_seen_in_the_reply(smollm2, tmp_path):
    """gpt-oss's markers are control tokens, whose text is otherwise empty: the reply shows them
    where they mark the reasoning, so that the budget's closing marker ends it, the answer
    follows, and the text holds neither."""
    import json

    from conftest import run_cli

    from infer.runtime.reasoning import detect

    fmt = detect(HARMONY)
    assert fmt is not None and fmt.starts_open
    assert fmt.close == "<jupyter_output><|im_start|>assistant<jupyter_code>final<jupyter_text>"
    template = tmp_path / "harmony.jinja"
    template.write_text(HARMONY)
    # (the embedded model ends its reasoning after one token: a budget of 1 closes it first)
    result = json.loads(run_cli("run", smollm2, "What is 2+2?", "--chat-template-file", template,
                                "--reasoning-budget", "1", "--grammar", _forced("The answer is 4."),
                                "--temp", "0", "-n", "40", "--json").stdout)
    assert result["text"] == "The answer is 4." and result["reasoning"].strip()
    assert "<jupyter" not in result["reasoning"] + result["text"]
    # the reasoning's tokens and the closing marker's 6 (its control tokens count)
    assert 1 + 6 <= result["usage"]["reasoning_tokens"] < result["usage"]["completion_tokens"]
