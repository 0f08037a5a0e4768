"""Prompts: the model's own chat template, trimmed by whole turns in tokens."""

from __future__ import annotations

import pytest

from serge.engine import ContextTooLong, Message
from serge.engine.generation.prompting.prompts import build_prompt

from conftest import MODEL

pytestmark = pytest.mark.real_model


def _conversation(turns: int) -> list[Message]:
    messages = [Message("system", "You are Serge, a helpful assistant.")]
    for i in range(turns):
        messages += [Message("user", f"Question number {i}: " + "tell me more " * 10),
                     Message("assistant", f"Answer number {i}: " + "here is more " * 10)]
    return messages + [Message("user", "The final question?")]


def test_prompt_uses_the_tokenizers_chat_template(engine):
    tokenizer = engine.model(MODEL).tokenizer
    prompt = build_prompt(tokenizer, [Message("user", "Hi")], context_window=2048)
    text = tokenizer.decode(prompt.ids)
    assert "<|im_start|>user\nHi<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")


def test_a_long_conversation_is_trimmed_by_whole_turns_keeping_the_system_prompt(engine):
    tokenizer = engine.model(MODEL).tokenizer
    messages = _conversation(20)
    full = build_prompt(tokenizer, messages, context_window=100_000)
    prompt = build_prompt(tokenizer, messages, context_window=400, max_new_tokens=64)
    text = tokenizer.decode(prompt.ids)

    assert len(prompt.ids) + 64 <= 400 < len(full.ids)
    assert prompt.dropped_messages > 0 and prompt.dropped_messages % 2 == 0, "whole turns, user and reply together"
    assert text.count("You are Serge, a helpful assistant.") == 1
    assert "The final question?" in text
    assert "Question number 0:" not in text
    kept = [i for i in range(20) if f"Question number {i}:" in text]
    assert kept == list(range(20 - len(kept), 20)), "the newest turns are kept, the oldest dropped"
    assert all(f"Answer number {i}:" in text for i in kept), "a kept question keeps its answer"
    assert prompt.room >= 64


def test_a_message_too_long_for_the_window_is_refused(engine):
    tokenizer = engine.model(MODEL).tokenizer
    with pytest.raises(ContextTooLong, match="context window"):
        build_prompt(tokenizer, [Message("user", "word " * 500)], context_window=256)
    with pytest.raises(ContextTooLong, match="max_new_tokens"):
        build_prompt(tokenizer, [Message("user", "hi")], context_window=256, max_new_tokens=256)


def _drop_one_turn_at_a_time(tokenizer, messages, context_window, max_new_tokens):
    """The plain definition of the cut: the fewest oldest turns dropped so that the rest fits."""
    system, rest = messages[:1], messages[1:]
    starts = [i for i, m in enumerate(rest) if m.role == "user"]
    for start in starts:
        ids = tokenizer.apply_chat_template([{"role": m.role, "content": m.content} for m in system + rest[start:]],
                                            add_generation_prompt=True, tokenize=True, return_dict=False)
        if len(ids) + max_new_tokens <= context_window:
            return list(ids), start
    raise AssertionError("nothing fits")


def test_the_cut_keeps_as_many_turns_as_fit_for_any_window(engine):
    tokenizer = engine.model(MODEL).tokenizer
    messages = [Message("system", "You are Serge.")]
    for i in range(30):  # turns of very different lengths, so an estimate alone would often cut wrongly
        messages += [Message("user", f"Q{i} " + "why " * (i * 7 % 23)),
                     Message("assistant", f"A{i} " + "because " * (i * 13 % 41))]
    messages.append(Message("user", "Last?"))
    for window in (160, 200, 333, 512, 777, 1000, 1500):
        expected, dropped = _drop_one_turn_at_a_time(tokenizer, messages, window, 32)
        prompt = build_prompt(tokenizer, messages, context_window=window, max_new_tokens=32)
        assert (prompt.ids, prompt.dropped_messages) == (expected, dropped), f"window {window}"


class CountingTokenizer:
    """The real tokenizer, counting how many messages it renders or tokenises."""

    def __init__(self, inner) -> None:
        self.inner, self.renders, self.messages = inner, 0, 0

    def apply_chat_template(self, conversation, **kwargs):
        self.renders += 1
        self.messages += len(conversation)
        return self.inner.apply_chat_template(conversation, **kwargs)

    def __call__(self, text, **kwargs):
        self.messages += len(text) if isinstance(text, list) else 1
        return self.inner(text, **kwargs)


def test_trimming_costs_what_is_kept_not_what_is_dropped(engine):
    tokenizer = engine.model(MODEL).tokenizer
    work = {}
    for turns in (50, 1000):
        counting = CountingTokenizer(tokenizer)
        prompt = build_prompt(counting, _conversation(turns), context_window=2048, max_new_tokens=64)
        kept = 2 * turns + 2 - prompt.dropped_messages
        assert prompt.dropped_messages > 0 and len(prompt.ids) + 64 <= 2048
        assert counting.renders <= 6, f"{counting.renders} template renders for a {turns}-turn chat"
        work[turns] = counting.messages
        assert counting.messages <= 4 * kept + 100, f"{counting.messages} messages handled to keep {kept}"
    assert work[1000] <= work[50] * 1.5, f"twenty times the chat, {work[1000] / work[50]:.1f} times the work"
