"""The llama.cpp engine's own promises, on the bundled GGUF (the shared ones run on both engines elsewhere)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from serge.engine import ChatRequest, FinishReason, Message, ModelLibrary, SamplingParams
from serge.engine.llamacpp.memory import planned_layout

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
    windows = []
    for _ in range(3):  # a thread left spinning is busy in every second; a passing blip (a collection) in one
        cpu, wall = time.process_time(), time.monotonic()
        time.sleep(1.0)
        windows.append((time.process_time() - cpu) / (time.monotonic() - wall))
        if windows[-1] < 0.05:
            return
    pytest.fail(f"the process kept {min(windows):.0%} of a core busy with nothing to do, second after second")


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
    registry = registry_for(llama, "llama.cpp", llama={"kv_cache_mb": 16})  # ~700 cells
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


def _bytes_per_parked_token(forward) -> float:
    """What one more token of a sequence takes in llama.cpp's own copy of it: the cells' real type. (Called
    while no reply runs: the worker thread is waiting, so these passes do not race its own.)"""
    kv = forward.new_kv()
    try:
        forward.prefill(kv, list(range(1000, 1100)))
        short = len(forward.park(kv))
        forward.prefill(kv, list(range(1100, 1200)))
        return (len(forward.park(kv)) - short) / 100
    finally:
        kv.release()


def test_the_loaded_kv_cache_has_the_layout_and_type_the_estimate_counted(llama, server):
    """By default every reply gets the bundled model's whole trained window, its keys in q8_0."""
    import llama_cpp as lc

    llama.chat(MODEL, ChatRequest(QUESTION, GREEDY)).text()  # the worker thread has made the context
    forward = llama.model(MODEL).scheduler.forward
    facts = ModelLibrary(llama.settings.models_path).find(MODEL).facts
    assert (forward.slices, forward.cells, forward.bytes_per_token) == planned_layout(facts, registry_for(llama).options)
    assert (forward.slices, forward.cells, forward.kv.name, forward.kv.flash_attention) == (8, 8192, "f16", True)
    assert (lc.llama_n_ctx(forward._ctx), lc.llama_n_seq_max(forward._ctx)) == (8 * 8192, 8)
    assert abs(_bytes_per_parked_token(forward) - forward.bytes_per_token) <= 16, "23,040 bytes a token in f16"
    health = next(m for m in httpx.get(f"{server}/api/health").json()["models_loaded"] if m["name"] == MODEL)
    assert health["kv_cache"] == "8 x 8192 cells, f16" and health["context_window"] == 8192


@pytest.mark.parametrize("kv, cells, per_token", [("q8_0-keys", 951, 17_640), ("q8_0", 1370, 12_240)])
def test_each_kv_type_is_made_in_that_type_within_its_megabytes(llama, kv, cells, per_token):
    registry = registry_for(llama, "llama.cpp", llama={"kv_type": kv, "kv_cache_mb": 16})
    try:
        model = registry.get(MODEL)
        assert model.submit(ChatRequest(QUESTION, SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True))).text()
        forward = model.scheduler.forward
        assert (forward.slices, forward.cells, forward.kv.name, forward.bytes_per_token) == (1, cells, kv, per_token)
        assert abs(_bytes_per_parked_token(forward) - per_token) <= 16
        planned = planned_layout(registry.library.find(MODEL).facts, registry.options)
        assert planned == (forward.slices, forward.cells, forward.bytes_per_token), "the estimate's layout is made"
    finally:
        registry.close()


def test_a_request_of_7000_tokens_fits_the_bundled_model_and_gets_its_reply(llama):
    """Open WebUI's 36 tools are ~6,600 tokens with every chat; a 4,096-token window refused them all."""
    tokenizer = llama.model(MODEL).tokenizer
    words = " ".join(f"tool{i}: looks up item {i} and returns its name, price and stock." for i in range(345))
    assert 7000 < len(tokenizer(words)["input_ids"]) < 7400
    stream = llama.chat(MODEL, ChatRequest([Message("system", words), Message("user", "Which tool looks up item 7?")],
                                    SamplingParams(temperature=0, max_new_tokens=3, ignore_eos=True)))
    stream.text()
    assert stream.record.error is None and stream.record.completion_tokens == 3
    assert stream.prompt_tokens > 7000


def test_many_streams_at_once_leave_no_thread_behind(llama):
    llama.chat(MODEL, ChatRequest(QUESTION, GREEDY)).text()
    before = {t.ident for t in threading.enumerate()}
    streams = [llama.chat(MODEL, ChatRequest([Message("user", f"Say {i}.")], GREEDY)) for i in range(6)]
    assert all(s.text() is not None for s in streams)
    time.sleep(0.2)
    assert {t.ident for t in threading.enumerate()} <= before
