"""Properties of the prompt builder, over conversations Hypothesis makes up, on the real tokenizer and template.

Whatever the chat holds and however small the window, `build_prompt` either returns a prompt that leaves
the reply its room, or refuses with `ContextTooLong`; the prompt is exactly the chat template's rendering of
the system prompt and the newest whole turns, `dropped_messages` counts the oldest messages left out, and no
older turn that would still fit is dropped. Lone surrogates never reach it: the API refuses them first.
"""

from __future__ import annotations

import httpx
import pytest
from conftest import MODEL
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serge.engine import ContextTooLong, Message
from serge.engine.generation.prompting.prompts import DEFAULT_REPLY_ROOM, build_prompt

pytestmark = pytest.mark.real_model

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                           HealthCheck.function_scoped_fixture])

# Any text a person could type (no lone surrogates: see the last test), short and long, and runs of
# blanks, which the tokenizer merges with the template's own newlines (so counting each message apart
# is only an estimate of the rendered prompt).
text = st.text(max_size=40) | st.text(st.characters(codec="utf-8"), max_size=400) | st.builds(
    lambda word, n: (word + " ") * n, st.text(min_size=1, max_size=8), st.integers(1, 300)) | st.text(
    st.sampled_from(" \n\tab"), max_size=80)


@st.composite
def conversations(draw) -> list[Message]:
    """An optional system prompt, then turns: a user message and (but for the last turn) the reply."""
    messages = [Message("system", draw(text))] if draw(st.booleans()) else []
    turns = draw(st.integers(1, 12))
    for i in range(turns):
        messages.append(Message("user", draw(text)))
        if i < turns - 1:
            messages.append(Message("assistant", draw(text)))
    return messages


def render(tokenizer, messages: list[Message]) -> list[int]:
    return list(tokenizer.apply_chat_template([m.as_openai(parsed_arguments=True) for m in messages], add_generation_prompt=True,
                                              tokenize=True, return_dict=False))


@pytest.fixture(scope="module")
def tokenizer(engine):
    return engine.model(MODEL).tokenizer


@PROPERTY
@given(conversations(), st.integers(64, 1500), st.none() | st.integers(1, 1600))
def test_the_prompt_fits_keeps_the_newest_turns_whole_and_counts_what_it_dropped(tokenizer, messages, window,
                                                                                  max_new_tokens):
    reserve = max_new_tokens or min(DEFAULT_REPLY_ROOM, window // 4)
    system = messages[:1] if messages[0].role == "system" else []
    try:
        prompt = build_prompt(tokenizer, messages, context_window=window, max_new_tokens=max_new_tokens)
    except ContextTooLong as exc:
        assert "context window" in str(exc)
        newest = system + messages[-1:]
        assert (max_new_tokens or 0) >= window or len(render(tokenizer, newest)) + reserve > window, \
            "refused although the system prompt and the newest message fit"
        return

    assert len(prompt.ids) + reserve <= window and prompt.room == window - len(prompt.ids)
    kept = system + messages[len(system) + prompt.dropped_messages:]
    assert prompt.ids == render(tokenizer, kept), "the prompt is the template's rendering of what is kept"
    assert kept[-1] is messages[-1], "the newest message is always kept"
    first = kept[len(system)]
    assert first.role == "user", "whole turns are dropped: what is kept starts with a question"
    assert [m.role for m in kept[len(system):]] == ["user", "assistant"] * (len(kept[len(system):]) // 2) + ["user"]
    if prompt.dropped_messages:  # no older turn that would still fit was dropped
        one_more = system + messages[len(system) + prompt.dropped_messages - 2:]
        assert len(render(tokenizer, one_more)) + reserve > window


@PROPERTY
@given(st.lists(text, min_size=1, max_size=4), st.integers(64, 600))
def test_any_text_in_any_role_order_builds_a_prompt_or_a_clear_refusal(tokenizer, texts, window):
    """Odd histories (no system prompt, assistant first, two questions in a row) never crash the builder."""
    roles = ["assistant", "user", "user", "assistant"]
    messages = [Message(roles[i % 4], t) for i, t in enumerate(texts)] + [Message("user", texts[-1])]
    try:
        prompt = build_prompt(tokenizer, messages, context_window=window)
    except ContextTooLong:
        return
    assert len(prompt.ids) + min(DEFAULT_REPLY_ROOM, window // 4) <= window


@pytest.mark.parametrize("path", ["/v1/chat/completions", "chat"])
def test_a_lone_surrogate_is_refused_with_a_400_before_any_prompt_is_built(server, path):
    body = '{"model": "%s", "messages": [{"role": "user", "content": "half a pair: \\ud800"}]}' % MODEL
    with httpx.Client(base_url=server, timeout=60) as client:
        if path == "chat":
            chat = client.post("/api/chats", json={}).json()["id"]
            path, body = f"/api/chats/{chat}/messages", '{"content": "half a pair: \\ud800"}'
        response = client.post(path, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    assert "surrogate" in response.json()["error"]["message"]
