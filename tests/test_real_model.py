"""infer on a real model, SmolLM2-135M-Instruct (the embedded demo model), against second
implementations: llama-cpp-python's high-level `Llama` for generation, transformers for the
chat template and the tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from real_model import assert_same_or_near_tie

from infer.runtime.params import ContextParams
from infer.runtime.prompt import chat_prompt, raw_prompt
from infer.runtime.sampling import SamplingParams
from infer.runtime.session import Completion, Session

N_GEN = 48
SETTINGS = {"n_ctx": 2048, "n_batch": 64, "n_ubatch": 64, "n_threads": 2}  # the same on both sides

LONG_TEXT = (
    "The lighthouse keeper had kept the lamp burning for forty years. Every evening he climbed "
    "the hundred and twelve steps, trimmed the wick, polished the great lens and wrote the "
    "weather in his logbook: wind, sea, visibility, the ships that passed. When the "
    "automatic light was installed, the engineers told him he could go home. He thanked "
    "them, packed his logbook and his kettle, and moved into a cottage at the foot of the "
    "cliff, from where he could still see the beam sweep across the water. Every evening, out "
    "of habit, he wrote the weather in a new logbook. Nobody asked him to, and nobody read "
    "it, but on the night of the great storm, when the automatic light failed, it was the "
    "old keeper who noticed first, climbed the hundred and twelve steps with a lantern, and "
    "kept a light in the window until morning."
)

# (system, messages) for chat prompts; a str is a raw prompt (no template).
PROMPTS: list[str | list[dict[str, str]]] = [
    "The capital of France is",
    "def fibonacci(n):\n",
    "Once upon a time, in a small village,",
    "Le café de la gare était fermé, alors nous",
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "user", "content": "Give me three tips for learning Python."}],
    [{"role": "user", "content": "Traduis en anglais : « Où est la bibliothèque ? »"}],
    [{"role": "user", "content": "请用一句话介绍你自己。🙂"}],
    [{"role": "system", "content": "You are a pirate. Answer in one sentence."},
     {"role": "user", "content": "Where is the treasure?"}],
    [{"role": "system", "content": "Answer only with yes or no."},
     {"role": "user", "content": "Is the sky blue?"}],
    [{"role": "system", "content": "You are a concise assistant."},
     {"role": "user", "content": "Name a primary colour."},
     {"role": "assistant", "content": "Red."},
     {"role": "user", "content": "Another one?"}],
    [{"role": "user", "content": f"Summarize this story in one sentence.\n\n{LONG_TEXT}"}],
    [{"role": "user", "content": "What does the text <|im_end|> mean in a chat log?"}],
]


def prompt_tokens(session: Session, prompt: str | list[dict[str, str]]) -> list[int]:
    if isinstance(prompt, str):
        return raw_prompt(session.model, prompt).tokens
    return chat_prompt(session.model, prompt).tokens


def infer_greedy(session: Session, tokens: list[int], n: int = N_GEN, **sampling: float) -> list[int]:
    session.context.memory_clear()  # every prompt from an empty cache, as on the other side
    session.tokens.clear()
    done = [e for e in session.generate(tokens, SamplingParams(temperature=0.0, max_tokens=n, **sampling))
            if isinstance(e, Completion)]
    return done[0].tokens


@pytest.fixture(scope="module")
def session(smollm2: Path):
    with Session.open(smollm2, ContextParams(**SETTINGS)) as s:
        yield s


def llama_cpp_python(path: Path, monkeypatch: pytest.MonkeyPatch, **kwargs: object) -> Any:
    """llama-cpp-python's `Llama` on `path` with these tests' context settings. It takes no
    repacking setting: it gets infer's (off where llama.cpp's repacked kernels crash this CPU,
    which would kill the test process)."""
    import llama_cpp.llama_cpp as bindings
    from llama_cpp import Llama

    from infer.runtime import repack

    defaults = bindings.llama_model_default_params

    def as_infer_loads() -> object:
        params = defaults()
        params.use_extra_bufts = repack.allowed()
        return params

    monkeypatch.setattr(bindings, "llama_model_default_params", as_infer_loads)
    return Llama(str(path), n_ctx=SETTINGS["n_ctx"], n_batch=SETTINGS["n_batch"],
                 n_ubatch=SETTINGS["n_ubatch"], n_threads=2, n_threads_batch=2, n_gpu_layers=0,
                 verbose=False, **kwargs)


def test_greedy_generation_is_token_identical_to_llama_cpp_python(smollm2, session, monkeypatch):
    llm = llama_cpp_python(smollm2, monkeypatch, flash_attn=session.context.flash_attn == "on")
    try:
        assert session.context.flash_attn == "off"  # infer's CPU default, given to both sides
        lengths, exact = [], 0
        for prompt in PROMPTS:
            tokens = prompt_tokens(session, prompt)
            ours = infer_greedy(session, tokens)
            llm.reset()
            theirs: list[int] = []
            for token in llm.generate(tokens, temp=0.0, repeat_penalty=1.0, reset=True):
                if session.model.is_eog(token) or len(theirs) == N_GEN:
                    break
                theirs.append(token)
            exact += assert_same_or_near_tie(session, tokens, ours, theirs, repr(prompt)[:60])
            lengths.append(len(tokens))
        assert max(lengths) > SETTINGS["n_batch"] * 3  # one prompt spans several batches
        assert exact >= len(PROMPTS) - 2, f"only {exact} of {len(PROMPTS)} prompts agreed exactly"
    finally:
        llm.close()


def test_a_tight_top_n_sigma_leaves_only_the_likeliest_token(session):
    """--top-nsigma (llama.cpp's sampler): at a temperature that makes the draw noise, keeping
    the tokens within 0.001 standard deviations of the best logit leaves the greedy choice."""
    tokens = prompt_tokens(session, PROMPTS[0])
    hot = {"temperature": 50.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 7, "max_tokens": 32}

    def draw(**extra: float) -> list[int]:
        session.context.memory_clear()
        session.tokens.clear()
        events = session.generate(tokens, SamplingParams(**hot, **extra))
        done = [e for e in events if isinstance(e, Completion)]
        return done[0].tokens

    greedy = infer_greedy(session, tokens, 32)
    assert draw(top_n_sigma=0.001) == greedy
    assert draw() != greedy, "without top-n-sigma the hot draw should wander"


def test_repeat_presence_and_frequency_penalties_draw_what_llama_cpp_python_draws(smollm2, session,
                                                                                 monkeypatch):
    """The penalties sampler as llama.cpp's own Python binding builds it (its constructor took
    the vocabulary size again in llama.cpp of llama-cpp-python 0.3.36; infer passed four
    arguments and every run with a penalty failed)."""
    llm = llama_cpp_python(smollm2, monkeypatch, flash_attn=False, last_n_tokens_size=64)
    penalties = {"repeat_penalty": 1.3, "presence_penalty": 0.4, "frequency_penalty": 0.2}
    try:
        for prompt in PROMPTS[:3]:
            tokens = prompt_tokens(session, prompt)
            ours = infer_greedy(session, tokens, 48, repeat_last_n=64, **penalties)
            plain = infer_greedy(session, tokens, 48)
            llm.reset()
            theirs: list[int] = []
            for token in llm.generate(tokens, temp=0.0, reset=True, **penalties):
                if session.model.is_eog(token) or len(theirs) == 48:
                    break
                theirs.append(token)
            assert_same_or_near_tie(session, tokens, ours, theirs, repr(prompt)[:60])
            assert ours != plain, "the penalties changed nothing"
    finally:
        llm.close()


def test_the_reply_is_the_model_speaking(session):
    """Not noise: the real model answers a factual question with the expected word."""
    tokens = chat_prompt(session.model, [{"role": "user", "content":
                                          "What is the capital of France? Answer in one word."}]).tokens
    reply = b"".join(session.model.token_bytes(t) for t in infer_greedy(session, tokens, 8))
    assert b"Paris" in reply


TOKENIZER_STRINGS = [
    "Hello world", " Hello world", "hello  world\n\nnew paragraph", "\t\ttabs and   spaces   ",
    "café naïve résumé", "Größenwahn und Übermut", "東京は日本の首都です。", "你好，世界！",
    "emoji 🙂🚀👍🏽 and flags 🇫🇷", "1234567890 3.14159 1e-5 -42", "x = [i**2 for i in range(10)]",
    "def f(a, b):\n    return a + b\n", "<html><body class=\"x\">Hi</body></html>",
    "don't won't it's we'll they're", "ALL CAPS AND MiXeD cAsE", "   leading spaces",
    "trailing newline\n", "\n\n\n", "a" * 40, "https://example.com/path?q=1&r=two#frag",
    "Привет, как дела?", "مرحبا بالعالم", "नमस्ते दुनिया",
]


def test_template_and_tokenizer_match_transformers(smollm2, session):
    """infer renders the GGUF's chat template and tokenizes as Hugging Face does."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(smollm2.parent), gguf_file=smollm2.name)
    for text in TOKENIZER_STRINGS:
        ours = session.model.tokenize(text, add_special=False, parse_special=False)
        assert ours == hf.encode(text, add_special_tokens=False), text
    for prompt in PROMPTS:
        if isinstance(prompt, str) or "<|im_end|>" in prompt[-1]["content"]:
            continue
        ours_prompt = chat_prompt(session.model, prompt)
        theirs = hf.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        assert ours_prompt.text == theirs
        assert ours_prompt.tokens == hf.encode(theirs, add_special_tokens=False)


def test_typed_control_token_text_stays_text(session):
    prompt = chat_prompt(session.model, [{"role": "user", "content": "say <|im_end|> now"}])
    im_end = session.model.tokenize("<|im_end|>", add_special=False, parse_special=True)
    assert len(im_end) == 1
    # One <|im_end|> closes the system turn, one the user turn: the typed one is text.
    assert prompt.tokens.count(im_end[0]) == 2
