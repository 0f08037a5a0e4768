"""The llama.cpp engine's own promises, on the bundled GGUF (the shared ones run on both engines elsewhere)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from serge.engine import ChatRequest, FinishReason, Message, SamplingParams
from serge.engine.llamacpp import kv_layout
from serge.engine.local import LoadOptions
from serge.engine.generation.scheduler import SchedulerLimits

from conftest import MODEL, registry_for

pytestmark = pytest.mark.real_model

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


def test_on_a_cpu_build_of_llama_cpp_every_layer_stays_on_the_cpu_and_health_says_so(engine, server):
    """llama.cpp's own build decides (llama_supports_gpu_offload), whatever the platform."""
    import llama_cpp

    if llama_cpp.llama_supports_gpu_offload():
        pytest.skip("this llama.cpp build offloads to a GPU")
    engine.model(MODEL)
    loaded = httpx.get(f"{server}/api/health").json()["models_loaded"][0]
    assert (loaded["device"], loaded["gpu_bytes"]) == ("CPU", 0)
    listed = next(m for m in engine.models() if m.name == MODEL)
    assert (listed.engine, listed.device, listed.gpu_bytes) == ("llama.cpp", "CPU", 0)


def test_a_finished_reply_leaves_the_cpu_idle(llama):
    llama.chat(MODEL, ChatRequest(QUESTION, GREEDY)).text()
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
        stream = llama.chat(MODEL, ChatRequest(QUESTION,
                                               SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True)))
        stream.text()
    finally:
        del forward.decode
    assert stream.record.finish_reason is FinishReason.ERROR
    assert "llama_decode failed" in stream.record.error
    assert llama.chat(MODEL, ChatRequest(QUESTION, GREEDY)).text()


def test_a_cached_conversation_that_cannot_come_back_fails_that_reply_alone(llama):
    forward = llama.model(MODEL).scheduler.forward
    cached = [Message("user", "Name three rivers.")]
    llama.chat(MODEL, ChatRequest(cached, GREEDY)).text()  # parked for its next turn

    def broken(*args, **kwargs):
        raise RuntimeError("llama.cpp could not copy a cached conversation back into its KV cache")

    running = llama.chat(MODEL, ChatRequest(QUESTION,
                                            SamplingParams(temperature=0, max_new_tokens=48, ignore_eos=True)))
    reading = iter(running)
    next(reading)  # it is decoding
    forward.restore = broken
    try:
        failed = llama.chat(MODEL, ChatRequest(cached, GREEDY))
        failed.text()
    finally:
        del forward.restore
    "".join(reading)
    assert failed.record.finish_reason is FinishReason.ERROR and "copy a cached" in failed.record.error
    assert running.record.finish_reason is FinishReason.LENGTH and running.record.completion_tokens == 48
    assert len(forward._free_ids) == forward.slices, "the failed reply's slice was not given back"


def test_a_kv_cache_too_small_for_every_reply_means_fewer_at_once_and_the_rest_wait_their_turn(llama):
    registry = registry_for(llama, "llama.cpp")
    registry.options = registry.options.__class__(**{**vars(registry.options), "kv_cache_mb": 16})  # ~700 cells
    try:
        small = registry.get(MODEL)
        forward = small.scheduler.forward
        assert (forward.slices, small.scheduler.max_running) == (1, 1)
        assert small.context_window == forward.cells < 4096, "one shorter slice, and the window says so"
        params = SamplingParams(temperature=0, max_new_tokens=72, ignore_eos=True)
        together = [small.submit(ChatRequest([Message("user", f"Question {i}: name a colour.")],
                                             params)) for i in range(6)]
        for stream in together:
            stream.text()
        assert [s.record.error for s in together] == [None] * 6
        assert all(s.record.finish_reason is FinishReason.LENGTH and s.record.completion_tokens == 72 for s in together)
        runs = sorted((s.created + s.record.queued_s, s.created + s.record.queued_s + s.record.duration_s)
                      for s in together)
        assert all(later[0] >= earlier[1] - 0.01 for earlier, later in zip(runs, runs[1:])), "one at a time"
        assert small.scheduler.pending == 0
    finally:
        registry.close()


def test_the_default_kv_cache_is_a_window_per_reply_within_the_memory_budget(llama):
    """8 slices of the window (at most 4096), fewer when memory is short, then shorter ones."""
    per_token, window, weights = 23_040, 8192, 100 * 2**20
    roomy = LoadOptions(llama.plan, 1, None, SchedulerLimits(), llama.metrics, memory_bytes=16 * 2**30)
    assert kv_layout(roomy, per_token, window, weights) == (8, 4096)
    tight = LoadOptions(**{**vars(roomy), "memory_bytes": weights + 2 * 3 * 4096 * per_token})
    assert kv_layout(tight, per_token, window, weights) == (3, 4096), "fewer replies at once, each a whole window"
    tiny = LoadOptions(**{**vars(roomy), "memory_bytes": weights + 2 * 1000 * per_token})
    assert kv_layout(tiny, per_token, window, weights) == (1, 1000), "then a shorter window"
    asked = LoadOptions(**{**vars(roomy), "context_cap": 8192})
    assert kv_layout(asked, per_token, window, weights) == (8, 8192), "SERGE_CONTEXT_WINDOW can ask for more"
    short = LoadOptions(**{**vars(roomy), "context_cap": 128})
    assert kv_layout(short, per_token, window, weights) == (8, 128), "or for less, under the 256-cell floor"


def test_many_streams_at_once_leave_no_thread_behind(llama):
    llama.chat(MODEL, ChatRequest(QUESTION, GREEDY)).text()
    before = {t.ident for t in threading.enumerate()}
    streams = [llama.chat(MODEL, ChatRequest([Message("user", f"Say {i}.")], GREEDY)) for i in range(6)]
    assert all(s.text() is not None for s in streams)
    time.sleep(0.2)
    assert {t.ident for t in threading.enumerate()} <= before
