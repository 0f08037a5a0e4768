"""Prompts: the model's own chat template, trimmed by whole turns in tokens."""

from __future__ import annotations

import pytest

from serge.engine import ContextTooLong, Message
from serge.engine.prompts import build_prompt

from conftest import MODEL


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
