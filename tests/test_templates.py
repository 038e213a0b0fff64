"""Chat templates: every real template renders; the sandbox holds."""

from __future__ import annotations

import pytest
from tiny_model import fixtures_dir

from infer.runtime.errors import TemplateError
from infer.runtime.template import render

CONVERSATION = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy?"},
]

TEMPLATES = sorted((fixtures_dir() / "chat-templates").glob("*.jinja"))


def test_all_forty_templates_are_present():
    assert len(TEMPLATES) == 40


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.stem)
def test_real_template_renders_a_conversation(path):
    text = render(path.read_text(), CONVERSATION, bos_token="<s>", eos_token="</s>")
    # Every message the user and assistant wrote is in the prompt, in order.
    positions = [text.find(m["content"]) for m in CONVERSATION[1:]]
    assert all(p >= 0 for p in positions), (positions, text)
    assert positions == sorted(positions)
    # The system prompt is there too (some templates merge it into the first user turn).
    assert "You are a terse assistant." in text
    # The prompt ends by opening the assistant's turn, after the last user message.
    assert text.rstrip().find("And of Italy?") < len(text.rstrip())


def test_template_without_system_role_gets_it_merged():
    source = ("{% for m in messages %}{% if m.role == 'system' %}"
              "{{ raise_exception('System role not supported') }}{% endif %}"
              "[{{ m.role }}] {{ m.content }}\n{% endfor %}")
    text = render(source, CONVERSATION[:2])
    assert text == "[user] You are a terse assistant.\n\nWhat is the capital of France?\n"


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.stem)
def test_a_system_message_mid_conversation_reaches_the_prompt(path):
    """Agents send system messages after the first place (Claude Code: a user turn, then a
    system one); where a template refuses that, they join the system prompt."""
    later = [*CONVERSATION[:2], {"role": "system", "content": "Answer in French."},
             *CONVERSATION[2:], {"role": "system", "content": "Be brief."}]
    text = render(path.read_text(), later, bos_token="<s>", eos_token="</s>")
    for m in later:
        assert m["content"] in text, (m, text)


def test_later_system_messages_join_the_system_prompt_where_the_template_refuses_them():
    source = ("{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
              "{{ raise_exception('System message must be first') }}{% endif %}"
              "[{{ m.role }}] {{ m.content }}\n{% endfor %}")
    text = render(source, [CONVERSATION[1], {"role": "system", "content": "Be brief."}])
    assert text == "[system] Be brief.\n[user] What is the capital of France?\n"
    text = render(source, [*CONVERSATION[:2], {"role": "system", "content": "Be brief."}])
    assert text == "[system] You are a terse assistant.\n\nBe brief.\n[user] What is the capital of France?\n"


@pytest.mark.parametrize("source", [
    "{{ messages.__class__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ raise_exception.__globals__ }}",
    "{% set x = messages.append({'role': 'user', 'content': 'x'}) %}",
    "{{ cycler.__init__.__globals__.os }}",
])
def test_template_cannot_reach_python_internals(source):
    with pytest.raises(TemplateError):
        render(source, CONVERSATION)


def test_template_helpers_work():
    source = ("{{ bos_token }}{{ messages | tojson }}{{ strftime_now('%Y') | length }}"
              "{% if add_generation_prompt %}<go>{% endif %}{{ eos_token }}")
    text = render(source, CONVERSATION[:1], bos_token="<s>", eos_token="</s>")
    assert text.startswith('<s>[{"role": "system"')
    assert text.endswith("4<go></s>")


def test_raise_exception_is_a_template_error():
    with pytest.raises(TemplateError, match="refused"):
        render("{{ raise_exception('nope') }}", CONVERSATION[1:2])


def test_compiled_templates_are_cached_across_runs(tiny_qwen, infer_home):
    from conftest import run_cli

    first = run_cli("run", tiny_qwen, "Hi", "--show-prompt")
    cached = list((infer_home / "cache" / "templates").iterdir())
    assert len(cached) == 1
    second = run_cli("run", tiny_qwen, "Hi", "--show-prompt")
    assert second.stdout == first.stdout
    assert list((infer_home / "cache" / "templates").iterdir()) == cached


def test_a_template_that_writes_bos_gives_one_bos_and_no_warning(models_dir):
    # Mistral-style templates begin with {{ bos_token }}; llama.cpp would add a second BOS
    # and say so on stderr (seen with -v).
    from conftest import run_cli
    from tiny_model import build_llama_gguf

    from infer.runtime.llama import Model
    from infer.runtime.prompt import chat_prompt

    path = build_llama_gguf(models_dir / "tiny-spm-bos-template.gguf", vocab="llama-spm",
                            chat_template="{{ bos_token }}{% for m in messages %}[INST]{{ m.content }}"
                                          "[/INST]{% endfor %}")
    with Model(path) as model:
        tokens = chat_prompt(model, [{"role": "user", "content": "Hello"}]).tokens
        assert tokens[0] == model.bos and tokens[1] != model.bos
        assert tokens[1:] == model.tokenize("[INST]Hello[/INST]", add_special=False,
                                            parse_special=True)
    r = run_cli("run", path, "Hello", "-n", "2", "-v")
    assert r.returncode == 0, r.stderr
    assert "BOS token" not in r.stderr.replace("print_info: BOS token", "")
