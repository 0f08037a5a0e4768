"""Streaming lifecycle: each token once, no echo, cancellation, no thread left behind; on the stand-in
model, and as the proof of the guarantee on each real engine (`real_model`)."""

from __future__ import annotations

import threading
import time

import pytest

from serge.engine import ChatRequest, FinishReason, Message, SamplingParams
from serge.engine.generation.assembler import TextAssembler

MODEL = None  # each engine's default: the stand-in, or the bundled model

GREEDY = SamplingParams(temperature=0, max_new_tokens=16)


@pytest.fixture(scope="module", params=["standin", pytest.param("llama.cpp", marks=pytest.mark.real_model),
                                        pytest.param("transformers", marks=pytest.mark.real_model)])
def engine(request):
    if request.param == "standin":
        return request.getfixturevalue("standin_engine")
    return request.getfixturevalue("engines")(request.param)


def test_ten_streamed_turns_leave_no_thread_behind(engine):
    history = [Message("system", "You are a terse assistant."), Message("user", "Name a colour.")]
    engine.chat(MODEL, ChatRequest(history, GREEDY)).text()  # warm-up: pools that live for the process start here
    before = {t.ident for t in threading.enumerate()}
    for turn in range(10):
        stream = engine.chat(MODEL, ChatRequest(history, GREEDY))
        pieces = list(stream)
        record = stream.record
        assert "".join(pieces) == record.text, "the streamed pieces must add up to the reply, nothing twice"
        assert "Name a colour" not in record.text, "the prompt must never be echoed"
        assert record.completion_tokens > 0
        history += [Message("assistant", record.text), Message("user", f"Another one ({turn}).")]
    deadline = time.monotonic() + 10  # a finished stream's threads may take a moment to exit
    while not {t.ident for t in threading.enumerate()} <= before and time.monotonic() < deadline:
        time.sleep(0.01)
    after = {t.ident for t in threading.enumerate()}
    assert after <= before, f"threads left behind: {[t.name for t in threading.enumerate() if t.ident not in before]}"


def test_async_readers_that_hang_up_mid_reply_leave_no_thread_behind(engine):
    """An API client that goes away: its reply is cancelled and waited for on the server's event loop, which
    lives as long as the server, so no thread may be parked or kept for it (asyncio's default executor
    keeps its threads for the life of the loop)."""
    import asyncio

    long = SamplingParams(temperature=0, max_new_tokens=200, ignore_eos=True)
    question = [Message("user", "Tell me a long story.")]
    engine.chat(MODEL, ChatRequest(question, GREEDY)).text()  # warm-up, without the async path
    streams = []

    async def hang_up():
        stream = engine.chat(MODEL, ChatRequest(question, long))
        streams.append(stream)
        deltas = stream.adeltas()
        await anext(deltas)
        await deltas.aclose()  # as a response generator is closed when its client disconnects

    async def four_hang_ups():
        await asyncio.gather(*(hang_up() for _ in range(4)))

    loop = asyncio.new_event_loop()
    try:
        before = {t.ident for t in threading.enumerate()}
        loop.run_until_complete(four_hang_ups())
        assert all(s.done and s.record.finish_reason is FinishReason.CANCELLED for s in streams)
        deadline = time.monotonic() + 10
        while not {t.ident for t in threading.enumerate()} <= before and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [t.name for t in threading.enumerate() if t.ident not in before]
        assert not left, f"threads left behind while the loop lives: {left}"
    finally:
        loop.close()


def test_async_iteration_yields_the_same_pieces(engine):
    import asyncio

    messages = [Message("user", "Count from one to five.")]
    expected = engine.chat(MODEL, ChatRequest(messages, GREEDY)).text()

    async def collect():
        return [piece async for piece in engine.chat(MODEL, ChatRequest(messages, GREEDY))]

    assert "".join(asyncio.run(collect())) == expected


def test_cancelling_stops_generation_within_two_token_steps(engine):
    forward = engine.model(MODEL).scheduler.forward
    original = forward.decode
    calls = {"n": 0}

    def counting_forward(*args, **kwargs):
        calls["n"] += 1
        return original(*args, **kwargs)

    forward.decode = counting_forward
    try:
        stream = engine.chat(MODEL, ChatRequest([Message("user", "Tell me a very long story.")],
                                                SamplingParams(temperature=0, max_new_tokens=400, ignore_eos=True)))
        pieces = iter(stream)
        for _ in range(3):
            next(pieces)
        stream.cancel()
        at_cancel = calls["n"]
        record = stream.close()
        assert calls["n"] - at_cancel <= 2, "generation went on after cancel"
        assert record.finish_reason is FinishReason.CANCELLED
        assert record.completion_tokens < 400
    finally:
        del forward.decode  # back to the class's method
    assert "decode" not in vars(forward)


def test_a_consumer_that_walks_away_cancels_its_generation(engine):
    stream = engine.chat(MODEL, ChatRequest([Message("user", "Write a poem.")],
                                            SamplingParams(temperature=0, max_new_tokens=400, ignore_eos=True)))
    for _ in stream:
        break  # leaving the loop closes the iterator, which cancels and waits for the worker
    assert stream.done
    assert stream.record.finish_reason is FinishReason.CANCELLED


def test_stop_strings_end_the_reply_and_are_not_shown(engine):
    messages = [Message("user", "Count from 1 to 10, separated by commas.")]
    full = engine.chat(MODEL, ChatRequest(messages, SamplingParams(temperature=0, max_new_tokens=32))).text()
    stop = full.split()[2]  # "3," from the bundled model
    stream = engine.chat(MODEL, ChatRequest(messages, SamplingParams(temperature=0, max_new_tokens=32, stop=[stop])))
    pieces = list(stream)
    assert stream.record.finish_reason is FinishReason.STOP
    assert "".join(pieces) == stream.record.text == full[: full.index(stop)]


def test_max_new_tokens_ends_with_length(engine):
    stream = engine.chat(MODEL, ChatRequest([Message("user", "Tell me a story.")],
                                            SamplingParams(temperature=0, max_new_tokens=3, ignore_eos=True)))
    stream.text()
    assert stream.record.finish_reason is FinishReason.LENGTH
    assert stream.record.completion_tokens == 3


@pytest.mark.parametrize("text", ["naïve café 😀 日本語", "emoji 🦙🦙 and ✨"])
def test_assembler_never_emits_half_a_character(engine, text):
    tokenizer = engine.model(MODEL).tokenizer
    ids = tokenizer.encode(text, add_special_tokens=False)
    assembler = TextAssembler(tokenizer)
    pieces = [assembler.add(i) for i in ids] + [assembler.flush()]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == text


def test_assembler_holds_back_a_possible_stop_string(engine):
    tokenizer = engine.model(MODEL).tokenizer
    assembler = TextAssembler(tokenizer, stop=("END",))
    shown = "".join(assembler.add(i) for i in tokenizer.encode("one two EN", add_special_tokens=False))
    assert shown == "one two "  # "EN" might become "END"
    rest = "".join(assembler.add(i) for i in tokenizer.encode("D three", add_special_tokens=False))
    assert assembler.stopped and rest == "" and assembler.text == "one two "


def test_assembler_pieces_add_up_to_the_whole_decode_of_a_long_reply(engine):
    import random

    tokenizer = engine.model(MODEL).tokenizer
    rng = random.Random(7)
    ids = [rng.randrange(tokenizer.vocab_size) for _ in range(1500)]  # any ids, bytes split anywhere
    ids += tokenizer.encode("naïve café 😀 日本語 and the end", add_special_tokens=False)
    assembler = TextAssembler(tokenizer)
    pieces = [assembler.add(i) for i in ids] + [assembler.flush()]
    assert "".join(pieces) == assembler.text == tokenizer.decode(ids, skip_special_tokens=True)
