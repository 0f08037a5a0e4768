"""Warming a long chat on the real model: the warmed prompt is where the send's starts, the send prefills only
its new message, and the greedy reply is the one a cold send gets.

The scheduler's rules for a warm (never beside a reply, stopped by one) are tests/test_warming.py's, on the stand-in.
"""

from __future__ import annotations

import time

import pytest

from serge.engine import ChatRequest, Engine, Message, SamplingParams
from serge.engine.generation.prompting.prompts import HEADROOM_SHARE, build_prompt
from serge.settings import Settings

from conftest import MODEL

pytestmark = pytest.mark.real_model

GREEDY = SamplingParams(temperature=0, max_new_tokens=12)
WINDOW = 1024  # tokens: a long chat's send is a few seconds' prefill on two shared cores, not minutes
WORDS = ("the valley trail climbs past the old quarry and the cheese cooperative before it reaches "
         "the ridge where hikers stop for the view over three peaks and the frozen river").split()


def long_chat(n_messages: int) -> list[Message]:
    """A system prompt and `n_messages` alternating messages of about 60 tokens each (bench/long_chat.py's)."""
    out = [Message("system", "You are a helpful assistant.")]
    for i in range(n_messages):
        words = [WORDS[(i * 7 + j) % len(WORDS)] for j in range(45)]
        out.append(Message("user" if i % 2 == 0 else "assistant", f"Message {i}: " + " ".join(words)))
    return out


@pytest.fixture(scope="module", params=("llama.cpp", "transformers"))
def windowed(real_settings, request):
    """The bundled model on each local engine in turn, in a window of `WINDOW` tokens."""
    own = Settings(data_dir=real_settings.data_dir, models_dir=real_settings.models_path, engine=request.param,
                   context_window=WINDOW)
    with Engine(own) as engine:
        engine.model(MODEL)
        yield engine


def _value(engine, metric: str) -> float:
    return engine.metrics.registry.get_sample_value(metric, {"model": MODEL}) or 0.0


def test_a_thousand_message_chats_warmed_prompt_is_where_its_send_starts(engine):
    model = engine.model(MODEL)
    history = long_chat(1000)
    warmed = model.next_prompt(ChatRequest(history, GREEDY))
    window = model.context_window
    assert len(warmed) > window // 2, "most of the window is warmed"
    headroom = window // HEADROOM_SHARE
    messages = ["Where were we?", "\n\nA question after a blank line", "ok", " " + "tell me about the ridge " * 40,
                "a long one " * (headroom // 4)]
    cuts = set()
    for text in messages:
        send = build_prompt(model.tokenizer, [*history, Message("user", text)], window, GREEDY.max_new_tokens,
                            keep_cut=True)
        assert send.ids[: len(warmed)] == warmed, f"the send of {text[:20]!r} does not start with the warmed prompt"
        cuts.add(send.dropped_messages)
    assert len(cuts) == 1, "adding a message within the headroom moved the cut"
    # Without keep_cut the cut follows the message: what makes the warmed prompt of no use.
    moved = {build_prompt(model.tokenizer, [*history, Message("user", text)], window,
                          GREEDY.max_new_tokens).dropped_messages for text in messages}
    assert len(moved) > 1
    # A message past the headroom is cut for, as before: it is sent whole.
    huge = "a very long one " * (headroom // 2)
    send = build_prompt(model.tokenizer, [*history, Message("user", huge)], window, GREEDY.max_new_tokens,
                        keep_cut=True)
    assert model.tokenizer.decode(send.ids).count(huge.strip()) == 1 and send.dropped_messages > min(cuts)


def test_a_warmed_long_chat_prefills_only_its_new_message_and_replies_as_a_cold_one(windowed):
    engine = windowed
    model = engine.model(MODEL)
    history = long_chat(1000)
    send = ChatRequest([*history, Message("user", "Where were we?")], GREEDY, keep_cut=True)
    model.scheduler.forget_prefixes()
    cold = engine.chat(MODEL, send)
    cold_text = cold.text()
    assert cold.record.cached_tokens == 0

    model.scheduler.forget_prefixes()
    warmed = model.next_prompt(ChatRequest(history, GREEDY))
    before = _value(engine, "serge_warmed_tokens_total")
    assert engine.warm(MODEL, ChatRequest(history, GREEDY))
    deadline = time.monotonic() + 300
    while _value(engine, "serge_warmed_tokens_total") - before < len(warmed) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _value(engine, "serge_warmed_tokens_total") - before == len(warmed)

    prefilled = _value(engine, "serge_prefilled_tokens_total")
    stream = engine.chat(MODEL, send)
    assert stream.text() == cold_text, "a warmed chat's greedy reply differs from a cold one's"
    new = _value(engine, "serge_prefilled_tokens_total") - prefilled
    assert stream.record.cached_tokens == len(warmed)
    assert new == stream.prompt_tokens - len(warmed) < 32, "the send prefilled more than its new message"

    assert engine.warm(MODEL, ChatRequest(history, GREEDY))  # opened again: the cache holds it all, nothing runs
    time.sleep(0.5)
    assert _value(engine, "serge_warmed_tokens_total") - before == len(warmed)


def test_a_warm_never_loads_a_model_nor_reaches_a_remote_one(real_settings, tmp_path):
    own = Settings(data_dir=tmp_path, models_dir=real_settings.models_path,
                   remote_models={"far": {"url": "http://127.0.0.1:9/v1"}})  # nothing listens there
    with Engine(own) as engine:
        chat = ChatRequest(long_chat(6), GREEDY)
        assert not engine.warm(MODEL, chat)
        assert engine.status().loaded == [] and not engine.ready, "a warm loaded the model"
        assert not engine.warm("far", chat)
