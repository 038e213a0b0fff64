"""Chat turns reuse the KV cache: each turn prefills the new message and markup, not the history."""

from __future__ import annotations

import pytest

from infer.runtime.conversation import Conversation, Dropped
from infer.runtime.errors import ContextOverflowError
from infer.runtime.params import ContextParams
from infer.runtime.sampling import SamplingParams
from infer.runtime.session import Completion, Session

# One greedy token per reply: a single vocabulary token re-tokenizes to itself, so the
# cache holds exactly what the next turn renders.
ONE = SamplingParams(temperature=0.0, max_tokens=1)
MARKUP = 12  # "<|im_end|>\n<|im_start|>user\n" ... "<|im_start|>assistant\n" and the reply's end


def turn(conv, text, params=ONE):
    events = list(conv.send(text, params))
    return next(e for e in events if isinstance(e, Completion)), events


@pytest.fixture
def conv(tiny_qwen):
    with Session.open(tiny_qwen, ContextParams(n_ctx=512)) as session:
        yield Conversation(session, system="You are terse. " * 10)


def new_message_tokens(conv, text):
    return len(conv.session.model.tokenize(text, add_special=False, parse_special=False))


def test_each_turn_prefills_only_the_new_message(conv):
    first, _ = turn(conv, "Hello there, how are you today?")
    assert first.usage.cached_tokens == 0
    for text in ("Tell me about rivers.", "And about lakes, please.", "Thanks!"):
        done, _ = turn(conv, text)
        assert done.timings.prefill_tokens <= new_message_tokens(conv, text) + MARKUP
        assert done.usage.cached_tokens >= done.usage.prompt_tokens - new_message_tokens(conv, text) - MARKUP


def test_undo_and_retry_cut_the_cache_back(conv):
    turn(conv, "First message here.")
    turn(conv, "Second message here.")
    assert conv.undo()
    assert [m["role"] for m in conv.messages] == ["system", "user", "assistant"]
    again, _ = turn(conv, "Another second message.")
    assert again.timings.prefill_tokens <= new_message_tokens(conv, "Another second message.") + MARKUP
    retried = next(e for e in conv.retry(ONE) if isinstance(e, Completion))
    assert retried.timings.prefill_tokens <= 2  # the whole prompt is already in the cache
    assert retried.text == again.text  # greedy: the same reply


def test_clear_keeps_the_system_prompt(conv):
    turn(conv, "Hi")
    conv.clear()
    assert conv.messages == [{"role": "system", "content": "You are terse. " * 10}]


def test_full_context_drops_the_oldest_exchanges_but_never_the_system(tiny_qwen):
    with Session.open(tiny_qwen, ContextParams(n_ctx=256)) as session:
        conv = Conversation(session, system="Stay brief.")
        dropped = []
        for i in range(12):
            _, events = turn(conv, f"Message number {i}: " + "words " * 12,
                             SamplingParams(temperature=0.0, max_tokens=8))
            dropped += [e.exchanges for e in events if isinstance(e, Dropped)]
        assert sum(dropped) > 0
        assert conv.messages[0] == {"role": "system", "content": "Stay brief."}
        assert "Message number 11" in conv.messages[-2]["content"]
        assert len(conv.tokens()) <= session.n_ctx


def test_error_policy_refuses_instead(tiny_qwen):
    with Session.open(tiny_qwen, ContextParams(n_ctx=256)) as session:
        conv = Conversation(session, context_policy="error")
        with pytest.raises(ContextOverflowError):
            for i in range(12):
                turn(conv, f"Message number {i}: " + "words " * 12,
                     SamplingParams(temperature=0.0, max_tokens=8))


def test_a_restored_state_continues_exactly(tiny_qwen):
    import numpy as np

    def first_token_logits(conv, text):
        tokens = conv.tokens([*conv.messages, {"role": "user", "content": text}])
        cached = conv.session.prefill(tokens)
        return conv.session.context.logits(-1), len(tokens) - cached

    with Session.open(tiny_qwen, ContextParams(n_ctx=512)) as session:
        conv = Conversation(session, system="Be kind.")
        turn(conv, "Hello there.")
        turn(conv, "What is a lake?")
        saved_tokens, state = session.save_state()
        messages = list(conv.messages)
        expected, _ = first_token_logits(conv, "And a river?")
    with Session.open(tiny_qwen, ContextParams(n_ctx=512)) as fresh:
        assert fresh.restore_state(saved_tokens, state)
        conv = Conversation(fresh)
        conv.messages = messages
        got, prefilled = first_token_logits(conv, "And a river?")
        assert prefilled <= new_message_tokens(conv, "And a river?") + MARKUP
    assert np.abs(got - expected).max() / np.abs(expected).max() <= 1e-3
