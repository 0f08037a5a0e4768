"""The llama.cpp engine's own promises, on the bundled GGUF (the shared ones run on both engines elsewhere)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from serge.engine import FinishReason, Message, SamplingParams

from conftest import MODEL, registry_for

QUESTION = [Message("user", "What is the capital of France?")]
GREEDY = SamplingParams(temperature=0, max_new_tokens=12)


@pytest.fixture(scope="module")
def llama(engines):
    return engines("llama.cpp")


def test_without_cuda_the_bundled_gguf_is_served_by_llama_cpp(engine, server):
    assert engine.plan.device_type != "cuda"
    assert engine.model(MODEL).engine == "llama.cpp"
    health = httpx.get(f"{server}/api/health").json()
    assert {"name": MODEL, "engine": "llama.cpp"}.items() <= health["models_loaded"][0].items()


def test_a_finished_reply_leaves_the_cpu_idle(llama):
    llama.chat(MODEL, QUESTION, GREEDY).text()
    time.sleep(0.3)  # let the worker reach its wait
    cpu, wall = time.process_time(), time.monotonic()
    time.sleep(1.0)
    busy = (time.process_time() - cpu) / (time.monotonic() - wall)
    assert busy < 0.05, f"the process kept {busy:.0%} of a core busy with nothing to do"


def test_a_failing_forward_pass_ends_that_reply_with_a_clear_error_and_the_next_one_works(llama):
    forward = llama.model(MODEL).scheduler.forward

    def broken(*args, **kwargs):
        raise RuntimeError("llama_decode failed with status -3")

    forward.decode = broken
    try:
        stream = llama.chat(MODEL, QUESTION, SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True))
        stream.text()
    finally:
        del forward.decode
    assert stream.record.finish_reason is FinishReason.ERROR
    assert "llama_decode failed" in stream.record.error
    assert llama.chat(MODEL, QUESTION, GREEDY).text()


def test_a_full_kv_cache_gives_back_cached_conversations_then_makes_replies_take_turns(llama):
    registry = registry_for(llama, "llama.cpp")
    registry.options = registry.options.__class__(**{**vars(registry.options), "kv_cache_mb": 16})  # ~700 cells
    try:
        small = registry.get(MODEL)
        cells = small.scheduler.forward.cells
        params = SamplingParams(temperature=0, max_new_tokens=48, ignore_eos=True)
        for i in range(8):  # finished conversations fill the prefix cache (up to half the cells)
            small.submit([Message("user", f"Question {i}: name an animal.")], params).text()
        prefixes = small.scheduler._prefixes
        evicted = []
        original = prefixes.evict_oldest
        prefixes.evict_oldest = lambda: evicted.append(1) or original()
        longer = SamplingParams(temperature=0, max_new_tokens=72, ignore_eos=True)
        together = [small.submit([Message("user", f"Other question {i}: name a colour.")], longer) for i in range(10)]
        for stream in together:
            stream.text()
        assert [s.record.error for s in together] == [None] * 10
        assert all(s.record.text for s in together)
        assert all(s.record.finish_reason is FinishReason.LENGTH for s in together)
        assert evicted, f"the running replies never ran out of the {cells} cells: the test did not test"
        assert all(s.record.completion_tokens == 72 for s in together), "a reply that waited went on, not over"
    finally:
        registry.close()


def test_many_streams_at_once_leave_no_thread_behind(llama):
    llama.chat(MODEL, QUESTION, GREEDY).text()
    before = {t.ident for t in threading.enumerate()}
    streams = [llama.chat(MODEL, [Message("user", f"Say {i}.")], GREEDY) for i in range(6)]
    assert all(s.text() is not None for s in streams)
    time.sleep(0.2)
    assert {t.ident for t in threading.enumerate()} <= before
