"""One model, many requests: settings of one request never reach another."""

from __future__ import annotations

import threading

import pytest

from serge.engine import ChatRequest, Message, SamplingParams

from conftest import MODEL, registry_for

QUESTION = [Message("user", "What is the capital of France? Answer in one sentence.")]
GREEDY = SamplingParams(temperature=0, max_new_tokens=20)
ODD_SETTINGS = [
    SamplingParams(temperature=1.8, max_new_tokens=12, seed=1),
    SamplingParams(temperature=0.9, top_k=5, max_new_tokens=12, seed=2),
    SamplingParams(temperature=0.5, repetition_penalty=1.9, max_new_tokens=12, seed=3),
    SamplingParams(temperature=0, stop=["Paris", "."], max_new_tokens=12),
    SamplingParams(temperature=0, max_new_tokens=3),
]


@pytest.fixture(scope="module")
def engine(both_engines):
    return both_engines


@pytest.mark.real_model
def test_greedy_reply_is_the_same_before_during_and_after_other_settings(engine):
    model = engine.model(MODEL).model  # transformers only: llama.cpp's weights are not Python objects
    config_before = model.generation_config.to_dict() if model is not None else None
    attributes_before = set(vars(model)) if model is not None else None

    before = engine.chat(MODEL, ChatRequest(QUESTION, GREEDY)).text()
    others = [engine.chat(MODEL, ChatRequest([Message("user", "Tell me a joke.")], p)) for p in ODD_SETTINGS]
    during = engine.chat(MODEL, ChatRequest(QUESTION, GREEDY))
    threads = [threading.Thread(target=s.text) for s in others]
    for t in threads:
        t.start()
    during_text = during.text()
    for t in threads:
        t.join()
    after = engine.chat(MODEL, ChatRequest(QUESTION, GREEDY)).text()

    assert before == during_text == after
    if model is not None:
        assert model.generation_config.to_dict() == config_before, "a request wrote to the shared generation_config"
        assert set(vars(model)) == attributes_before, "a request left state on the shared model"


@pytest.mark.real_model
def test_same_seed_same_sample_whatever_ran_in_between(engine):
    sampled = SamplingParams(temperature=1.0, seed=1234, max_new_tokens=12)
    first = engine.chat(MODEL, ChatRequest(QUESTION, sampled)).text()
    engine.chat(MODEL, ChatRequest(QUESTION, SamplingParams(temperature=1.5, seed=99, max_new_tokens=12))).text()
    assert engine.chat(MODEL, ChatRequest(QUESTION, sampled)).text() == first


@pytest.mark.real_model
def test_eight_threads_asking_for_one_model_cause_exactly_one_load(engine):
    registry = registry_for(engine)
    got, barrier = [], threading.Barrier(8)

    def ask():
        barrier.wait()
        got.append(registry.get(MODEL))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert registry.loads == 1
        assert len({id(x) for x in got}) == 1
    finally:
        registry.close()


def test_merging_settings_makes_a_new_value():
    base = SamplingParams(temperature=0.2, top_p=0.9)
    request = SamplingParams(temperature=0.0, max_new_tokens=5)
    merged = request.over(base)
    assert (merged.temperature, merged.top_p, merged.max_new_tokens) == (0.0, 0.9, 5)
    assert base.temperature == 0.2 and base.max_new_tokens is None
