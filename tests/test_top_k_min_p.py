"""top_k and min_p change what can be sampled: at a high temperature, either one cut to the likeliest
token makes every seed give the greedy reply, and without them seeds differ (the stand-in model, engine level)."""

from __future__ import annotations

import pytest

from serge.engine import ChatRequest, Message, SamplingParams

from standin import NAME as MODEL, stand_in


# On the stand-in model (standin.py): nothing here needs the real one.
engine = stand_in("engine")


STORY = [Message("user", "Tell me a short story about a cat.")]
SEEDS = range(6)


def replies(engine, **settings) -> set[str]:
    """The replies of six seeds at temperature 1.5, generated side by side."""
    asks = [ChatRequest(STORY, SamplingParams(temperature=1.5, max_new_tokens=12, seed=seed, **settings))
            for seed in SEEDS]
    streams = [engine.chat(MODEL, ask) for ask in asks]
    return {stream.text() for stream in streams}


@pytest.fixture(scope="module")
def greedy(engine) -> str:
    return engine.chat(MODEL, ChatRequest(STORY, SamplingParams(temperature=0, max_new_tokens=12))).text()


def test_without_top_k_or_min_p_seeds_give_different_replies(engine, greedy):
    sampled = replies(engine)
    assert len(sampled) > 1 and sampled != {greedy}


def test_top_k_of_one_leaves_only_the_greedy_reply(engine, greedy):
    assert replies(engine, top_k=1) == {greedy}


def test_min_p_near_one_leaves_only_the_greedy_reply(engine, greedy):
    assert replies(engine, min_p=0.999) == {greedy}
