"""The scheduler's mechanics on the stand-in model: admission, the queue, timeouts and prefix reuse.

What these promise does not depend on the model's numbers (that greedy replies are the
same alone and batched is tests/test_batching.py's, on the real model).
"""

from __future__ import annotations

import time

import pytest

from serge.engine import ChatRequest, EngineBusy, FinishReason, Message, SamplingParams, SchedulerLimits
from serge.engine.generation.prompting.prompts import build_prompt

from standin import standin_model

GREEDY = SamplingParams(temperature=0, max_new_tokens=16)


@pytest.fixture(scope="module")
def engine(standin_engine):
    return standin_engine


def _small_scheduler(engine, **limits):
    """A stand-in model of its own with tight limits (10 ms a step), its scheduler closed after use."""
    return standin_model("small", step_s=0.01, limits=SchedulerLimits(**limits)).scheduler


def _prompt(engine, messages: list[Message]) -> list[int]:
    loaded = engine.model()
    return build_prompt(loaded.tokenizer, messages, loaded.context_window, 32).ids


def _counts(engine) -> tuple[int, int]:
    snap = engine.model().scheduler.metrics.snapshot()[engine.model().name]
    return snap.prefilled_tokens, snap.reused_tokens


def test_a_full_queue_answers_engine_busy_and_tells_queued_requests_their_place(engine):
    scheduler = _small_scheduler(engine, max_running=1, max_queue=1, prefix_cache_mb=0)
    try:
        params = SamplingParams(temperature=0, max_new_tokens=64, ignore_eos=True).resolved(1000)
        prompt = _prompt(engine, [Message("user", "Tell me a story.")])
        running = scheduler.submit(prompt, params)
        queued = scheduler.submit(prompt, params)
        with pytest.raises(EngineBusy) as busy:
            scheduler.submit(prompt, params)
        assert busy.value.retry_after_s > 0
        deadline = time.monotonic() + 30
        while running.queue_position is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert running.queue_position is None
        assert queued.queue_position == 0
    finally:
        scheduler.close()
    assert running.record.finish_reason is FinishReason.CANCELLED
    assert queued.record.finish_reason is FinishReason.CANCELLED


def test_a_request_waiting_past_its_timeout_ends_with_a_clear_error(engine):
    scheduler = _small_scheduler(engine, max_running=1, max_queue=4, queue_timeout_s=0.5, prefix_cache_mb=0)
    try:
        params = SamplingParams(temperature=0, max_new_tokens=256, ignore_eos=True).resolved(1000)
        prompt = _prompt(engine, [Message("user", "Tell me a story.")])
        running = scheduler.submit(prompt, params)
        deltas = iter(running)  # kept: a dropped iterator closes its stream
        next(deltas)  # it holds the only slot
        waiting = scheduler.submit(prompt, params)
        assert waiting.text() == ""
        record = waiting.record
        assert record.finish_reason is FinishReason.ERROR
        assert "waiting for a free slot; the server is busy" in record.error
        assert record.error.startswith("timed out after ")
        assert not running.done
    finally:
        scheduler.close()


def test_the_tenth_turn_of_a_chat_prefills_about_as_much_as_the_first(engine):
    engine.model().scheduler.forget_prefixes()
    messages: list[Message] = []
    prefilled = []
    params = SamplingParams(temperature=0, max_new_tokens=6)
    for turn in range(10):
        messages.append(Message("user", f"Turn {turn}: say a word."))
        before = _counts(engine)[0]
        reply = "".join(engine.chat(None, ChatRequest(messages, params)))
        prefilled.append(_counts(engine)[0] - before)
        messages.append(Message("assistant", reply))
    # The tenth turn runs only what is new, about as much as the first (time to first token follows).
    assert prefilled[-1] <= 1.5 * prefilled[0], prefilled

def test_prefix_reuse_gives_the_cold_text_and_prefills_only_what_is_new(engine):
    scheduler = engine.model().scheduler
    scheduler.forget_prefixes()
    first = [Message("user", "Give me a name for a cat.")]
    reply = engine.chat(None, ChatRequest(first, GREEDY)).text()
    second = first + [Message("assistant", reply), Message("user", "And one for a dog?")]
    shared, whole = len(_prompt(engine, first)), len(_prompt(engine, second))

    before = _counts(engine)
    warm = engine.chat(None, ChatRequest(second, GREEDY)).text()
    prefilled, reused = (after - start for after, start in zip(_counts(engine), before))
    assert reused > shared  # the first prompt and at least part of the reply
    assert prefilled == whole - reused

    scheduler.forget_prefixes()
    before = _counts(engine)
    cold = engine.chat(None, ChatRequest(second, GREEDY)).text()
    assert _counts(engine)[0] - before[0] == whole
    assert warm == cold


def test_a_regenerated_reply_needs_no_prefill_at_all(engine):
    engine.model().scheduler.forget_prefixes()
    question = [Message("user", "Pick a number.")]
    first = engine.chat(None, ChatRequest(question, GREEDY)).text()
    before = _counts(engine)
    again = engine.chat(None, ChatRequest(question, GREEDY)).text()
    prefilled, reused = (after - start for after, start in zip(_counts(engine), before))
    assert (prefilled, again) == (0, first) and reused == len(_prompt(engine, question))



def test_the_metrics_count_every_token_of_a_reply_once_it_has_ended(engine):
    """Token gaps are observed in batches (`passes.GAPS_HELD`), but before a reply's stream ends: a reader who
    sees the end and then reads the metrics finds every token and gap of it, while other replies run on."""
    scheduler = _small_scheduler(engine, max_running=2, prefix_cache_mb=0)
    registry, labels = scheduler.metrics.registry, {"model": scheduler.name}

    def counted() -> tuple[float, float]:
        return (registry.get_sample_value("serge_generated_tokens_total", labels) or 0.0,
                registry.get_sample_value("serge_inter_token_latency_seconds_count", labels) or 0.0)

    try:
        prompt = _prompt(engine, [Message("user", "Tell me a story.")])
        long = scheduler.submit(prompt, SamplingParams(temperature=0, max_new_tokens=400, ignore_eos=True).resolved(1000))
        pieces = iter(long)
        next(pieces)  # it runs: the batch never empties while the short reply runs
        short = scheduler.submit(prompt, SamplingParams(temperature=0, max_new_tokens=5, ignore_eos=True).resolved(1000))
        short.text()
        tokens, gaps = counted()
        assert tokens >= 5 and gaps >= 4, (tokens, gaps)
        long.close()  # cancelled: counted whole too
        assert counted() == (5 + long.record.completion_tokens, 4 + long.record.completion_tokens - 1)
    finally:
        scheduler.close()
