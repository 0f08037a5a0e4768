"""A full KV pool never fails a reply: the youngest waits, its KV given back, and then finishes with the
text it would have had (on the stand-in, whose pool is a count of positions; tests/test_paged.py has the blocks)."""

from __future__ import annotations

import pytest

from serge.engine import FinishReason, Message, SamplingParams, SchedulerLimits
from serge.engine.generation.prompts import build_prompt

from standin import StandInForward, shared_tokenizer, standin_model

QUESTIONS = ("Name a river.", "Say something about tea.", "Pick a colour for a door.")
SETTINGS = tuple(SamplingParams(temperature=t, seed=7, max_new_tokens=64).resolved(1000) for t in (0, 0, 0.9))  # the youngest samples


def _replies(capacity: int | None, prompts: list[list[int]], settings=SETTINGS):
    model = standin_model("room", reply_tokens=24, step_s=0.001, forward=StandInForward(24, 0.001, capacity),
                          limits=SchedulerLimits(max_running=16))
    try:
        streams = [model.scheduler.submit(ids, params) for ids, params in zip(prompts, settings)]
        texts = [s.text() for s in streams]
        return texts, [s.record.finish_reason for s in streams], model.scheduler.metrics
    finally:
        model.close()


def _preempted(metrics) -> float:
    return metrics.registry.get_sample_value("serge_preempted_total", {"model": "room"}) or 0.0


@pytest.mark.parametrize("spare", [30, -60], ids=["full-while-decoding", "full-while-prefilling"])
def test_the_youngest_reply_waits_for_room_then_finishes_with_the_text_it_had_alone(spare):
    tokenizer = shared_tokenizer()
    prompts = [build_prompt(tokenizer, [Message("user", q)], 8192, 32).ids for q in QUESTIONS]
    alone = [_replies(None, [ids], [params])[0][0] for ids, params in zip(prompts, SETTINGS)]
    capacity = sum(len(ids) for ids in prompts) + spare  # every prompt fits, or the last does not
    texts, reasons, metrics = _replies(capacity, prompts)
    assert _preempted(metrics) >= 1, "the pool never ran out: the test proves nothing"
    assert reasons == [FinishReason.STOP] * 3
    assert texts == alone
