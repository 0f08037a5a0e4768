"""Warming a chat's next prompt on the stand-in: never in a reply's way, stopped by one, taken by the next.

The scheduler's rules for a warm (`serge.engine.generation.kv.warming`) do not depend on the model's numbers;
that a warmed reply is the reply a cold one is, on the real model, is tests/test_warming_real.py's.
"""

from __future__ import annotations

import time

from serge.engine import ChatRequest, FinishReason, Message, SamplingParams, SchedulerLimits
from serge.engine.generation.prompting.prompts import build_prompt
from serge.engine.generation.kv.warming import MOST_WARMS

from standin import standin_model

LONG = SamplingParams(temperature=0, max_new_tokens=120, ignore_eos=True)
GREEDY = SamplingParams(temperature=0, max_new_tokens=16)


def _model(name: str, step_s: float = 0.005, chunk: int = 16, running: int = 1):
    return standin_model(name, step_s=step_s, limits=SchedulerLimits(max_running=running, prefill_chunk=chunk))


def _value(model, metric: str) -> float:
    return model.scheduler.metrics.registry.get_sample_value(metric, {"model": model.name}) or 0.0


def _warmed(model) -> float:
    return _value(model, "serge_warmed_tokens_total")


def _chat(turns: int, tag: str = "") -> list[Message]:
    messages = []
    for i in range(turns):
        messages += [Message("user", f"{tag}question {i} about the weather in town"),
                     Message("assistant", f"{tag}answer {i}: it rains, as it always does here")]
    return messages


def _ids(model, messages: list[Message]) -> list[int]:
    return build_prompt(model.tokenizer, messages, model.context_window, 16).ids


def _raw(model, text: str) -> list[int]:
    """A prompt without the chat template: one whose first token another's is not gives it nothing in the cache."""
    return model.tokenizer(text)["input_ids"]


def _story(model) -> list[int]:
    return _raw(model, "Tell me a story.")


def _until(condition, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)
    return condition()


def test_a_warm_never_runs_while_a_reply_runs_or_waits():
    model = _model("warm-waits")
    try:
        prompt = _story(model)
        running = model.scheduler.submit(prompt, LONG.resolved(1000))
        waiting = model.scheduler.submit(prompt, LONG.resolved(1000))
        history = _ids(model, _chat(10))
        assert model.scheduler.warm(history)
        seen = []
        while not waiting.done:
            seen.append((running.done, _warmed(model)))
            time.sleep(0.002)
        assert all(warmed == 0 for _, warmed in seen), "a warm ran beside a reply"
        assert any(not done for done, _ in seen) and any(done for done, _ in seen)  # both phases were watched
        assert _until(lambda: _warmed(model) == len(history))
    finally:
        model.close()


def test_a_request_arriving_mid_warm_stops_it_and_takes_what_was_warmed():
    model = _model("warm-stopped", step_s=0.01)
    try:
        chat = _chat(20)
        history = _ids(model, chat)
        question = chat + [Message("user", "And tomorrow?")]
        prompt = _ids(model, question)
        assert prompt[: len(history) - 8] == history[: len(history) - 8]
        cold = model.scheduler.submit(prompt, GREEDY.resolved(1000)).text()
        model.scheduler.forget_prefixes()
        assert model.scheduler.warm(history)
        assert _until(lambda: _warmed(model) >= 64)
        prefilled = _value(model, "serge_prefilled_tokens_total")
        reply = model.scheduler.submit(prompt, GREEDY.resolved(1000))
        assert reply.text() == cold
        warmed = _warmed(model)
        assert 64 <= warmed < len(history), "the warm was not stopped by the reply"
        record = reply.record
        assert record.finish_reason is FinishReason.LENGTH
        assert record.cached_tokens == warmed, "the reply did not take what was warmed"
        assert _value(model, "serge_prefilled_tokens_total") - prefilled == len(prompt) - warmed
        time.sleep(0.2)
        assert _warmed(model) == warmed  # a stopped warm does not come back on its own
    finally:
        model.close()


def test_warming_what_the_prefix_cache_holds_costs_nothing():
    model = _model("warm-twice", step_s=0.0)
    try:
        history = _ids(model, _chat(10))
        assert model.scheduler.warm(history)
        assert _until(lambda: _warmed(model) == len(history))
        passes = model.scheduler.forward.passes
        assert model.scheduler.warm(history)
        time.sleep(0.3)
        assert _warmed(model) == len(history)
        assert model.scheduler.forward.passes == passes
        longer = _ids(model, _chat(11))  # the chat one turn on: only its new turn runs
        assert model.scheduler.warm(longer)
        assert _until(lambda: _warmed(model) > len(history))
        time.sleep(0.1)
        assert _warmed(model) - len(history) < len(longer) - len(history) + 16
    finally:
        model.close()


def test_only_the_newest_few_warms_wait_one_per_party():
    model = _model("warm-bounded", step_s=0.001, chunk=256)
    try:
        running = model.scheduler.submit(_story(model), LONG.resolved(1000))
        prompts = [_raw(model, f"{i}: " + "the weather in town " * (5 + i)) for i in range(MOST_WARMS + 3)]
        for i, prompt in enumerate(prompts):
            assert model.scheduler.warm(prompt, party=f"user{i}")
        replaced = _raw(model, "z: " + "the weather in town " * 12)
        assert model.scheduler.warm(replaced, party=f"user{len(prompts) - 1}")  # in place of that party's earlier
        running.text()
        kept = prompts[len(prompts) - MOST_WARMS : -1] + [replaced]
        assert _until(lambda: _warmed(model) == sum(map(len, kept)))
        time.sleep(0.2)
        assert _warmed(model) == sum(map(len, kept))
    finally:
        model.close()


def test_a_warmed_chat_prefills_only_its_new_message_through_the_engine():
    model = _model("warm-engine", step_s=0.0, chunk=256, running=4)
    try:
        chat = _chat(30)
        request = ChatRequest(chat, GREEDY, keep_cut=True)
        cold = model.submit(ChatRequest([*chat, Message("user", "And tomorrow?")], GREEDY)).text()
        model.scheduler.forget_prefixes()
        assert model.warm(request)
        assert _until(lambda: _warmed(model) > 0)
        time.sleep(0.1)
        prefilled = _value(model, "serge_prefilled_tokens_total")
        stream = model.submit(ChatRequest([*chat, Message("user", "And tomorrow?")], GREEDY, keep_cut=True))
        assert stream.text() == cold
        new = len(model.tokenizer("<|im_start|>user\nAnd tomorrow?<|im_end|>\n<|im_start|>assistant\n")["input_ids"])
        assert _value(model, "serge_prefilled_tokens_total") - prefilled <= new
        assert stream.record.cached_tokens == stream.prompt_tokens - (_value(model, "serge_prefilled_tokens_total")
                                                                      - prefilled)
    finally:
        model.close()


def test_a_vision_prompt_is_never_warmed():
    from serge.engine.generation.prompting.images import Image

    model = _model("warm-images", step_s=0.0)
    try:
        image = Image(b"\x89PNG\r\n\x1a\n", "image/png", 1, 1)
        assert not model.warm(ChatRequest([Message("user", "What is this?", images=(image,))]))
    finally:
        model.close()
