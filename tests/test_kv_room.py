"""A full KV pool never fails a reply: the youngest waits, its KV given back, and then finishes with the
text it would have had (on the stand-in, whose pool is a count of positions; tests/test_paged.py has the blocks)."""

from __future__ import annotations

import pytest

from serge.engine import FinishReason, Message, SamplingParams, SchedulerLimits
from serge.engine.generation.prompting.prompts import build_prompt

from standin import StandInForward, shared_tokenizer, standin_model

QUESTIONS = ("Name a river.", "Say something about tea.", "Pick a colour for a door.")
SETTINGS = tuple(SamplingParams(temperature=t, seed=7, max_new_tokens=64).resolved(1000) for t in (0, 0, 0.9))  # the youngest samples


def _replies(capacity: int | None, prompts: list[list[int]], settings=SETTINGS):
    model = standin_model("room", reply_tokens=24, step_s=0.001, forward=StandInForward(24, 0.001, capacity=capacity),
                          limits=SchedulerLimits(max_running=16))
    try:
        streams = [model.scheduler.submit(ids, params) for ids, params in zip(prompts, settings)]
        texts = [s.text() for s in streams]
        return texts, [s.record.finish_reason for s in streams], model.scheduler.metrics
    finally:
        model.close()


def _prompt(tokenizer, question: str) -> list[int]:
    """A prompt that shares too little with the others to follow them (`shared_prefix`): each holds its own KV."""
    return build_prompt(tokenizer, [Message("system", question), Message("user", question)], 8192, 32).ids


def _preempted(metrics) -> float:
    return metrics.registry.get_sample_value("serge_preempted_total", {"model": "room"}) or 0.0


@pytest.mark.parametrize("spare", [30, -60], ids=["full-while-decoding", "full-while-prefilling"])
def test_the_youngest_reply_waits_for_room_then_finishes_with_the_text_it_had_alone(spare):
    tokenizer = shared_tokenizer()
    prompts = [_prompt(tokenizer, q) for q in QUESTIONS]
    alone = [_replies(None, [ids], [params])[0][0] for ids, params in zip(prompts, SETTINGS)]
    capacity = sum(len(ids) for ids in prompts) + spare  # every prompt fits, or the last does not
    texts, reasons, metrics = _replies(capacity, prompts)
    assert _preempted(metrics) >= 1, "the pool never ran out: the test proves nothing"
    assert reasons == [FinishReason.STOP] * 3
    assert texts == alone


def test_choices_made_to_wait_for_room_finish_with_the_texts_they_had_alone():
    """The youngest may be a choice whose prompt came from choice 0's KV, or choice 0 with choices still
    waiting for its prompt: each waits, runs its own tokens again, and finishes as it would have."""
    tokenizer = shared_tokenizer()
    prompt, other = _prompt(tokenizer, QUESTIONS[1]), _prompt(tokenizer, QUESTIONS[0])
    params = SamplingParams(temperature=0.9, seed=3, max_new_tokens=64).resolved(1000)

    def run(capacity):
        model = standin_model("room", reply_tokens=24, step_s=0.001,
                              forward=StandInForward(24, 0.001, capacity=capacity), limits=SchedulerLimits(max_running=16))
        try:
            first = model.scheduler.submit(other, SETTINGS[0])
            chosen = model.scheduler.submit(prompt, params, n=3)
            first.text(), chosen.text()
            return [r.text for r in chosen.records], [r.finish_reason for r in chosen.records], model.scheduler.metrics
        finally:
            model.close()

    alone, _, _ = run(None)
    texts, reasons, metrics = run(len(other) + len(prompt) + 60)  # copies share the prompt; 4 replies of 24 do not fit
    assert _preempted(metrics) >= 1, "the pool never ran out: the test proves nothing"
    assert reasons == [FinishReason.STOP] * 3
    assert texts == alone
