"""Remote models: a model name can point at an OpenAI-compatible server (here, another Serge)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from serge.engine import ChatRequest, Engine, FinishReason, Message, ResponseFormat, SamplingParams, Tool, Tools
from serge.settings import RemoteModel, Settings

from conftest import free_port
from standin import NAME as MODEL, stand_in


# On the stand-in model (standin.py): nothing here needs the real one.
settings, engine, server = stand_in("settings", "engine", "server")


QUESTION = [Message("user", "What is the capital of France?")]


@pytest.fixture(scope="module")
def front(server, settings, tmp_path_factory):
    """An engine with no local model of its own, driving the test server remotely."""
    front_settings = Settings(
        data_dir=tmp_path_factory.mktemp("front"), models_dir=settings.models_path,
        remote_models={"far-smollm": RemoteModel(url=f"{server}/v1", model=MODEL),
                       "unreachable": RemoteModel(url=f"http://127.0.0.1:{free_port()}/v1")},
        default_model="far-smollm",
    )
    with Engine(front_settings) as engine:
        yield engine


def test_a_remote_reply_matches_the_local_one(front, engine):
    greedy = SamplingParams(temperature=0, max_new_tokens=16)
    local = engine.chat(MODEL, ChatRequest(QUESTION, greedy)).text()
    stream = front.chat(None, ChatRequest(QUESTION, greedy))
    pieces = list(stream)
    assert "".join(pieces) == stream.record.text == local
    assert stream.record.completion_tokens > 0 and stream.record.prompt_tokens > 0
    assert front.ready and front.status().loaded == []


def _far(engine, metric: str, **labels) -> float:
    """A metric of the far server (the test server runs on the session's engine)."""
    return engine.metrics.registry.get_sample_value(metric, {"model": MODEL, **labels}) or 0.0


def test_cancelling_a_remote_stream_stops_the_far_generation(front, engine):
    threads = []
    for _ in range(2):  # the first may start pools that live for the process; the second must add nothing
        cancelled = _far(engine, "serge_requests_total", reason="cancelled")
        generated = _far(engine, "serge_generated_tokens_total")
        essay = ChatRequest([Message("user", "Write a long essay.")],
                            SamplingParams(temperature=0, max_new_tokens=400, ignore_eos=True))
        stream = front.chat("far-smollm", essay)
        for _ in stream:
            break
        assert stream.record.finish_reason is FinishReason.CANCELLED
        deadline = time.monotonic() + 30
        while _far(engine, "serge_requests_total", reason="cancelled") == cancelled and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _far(engine, "serge_requests_total", reason="cancelled") == cancelled + 1, "the far server went on"
        assert 0 < _far(engine, "serge_generated_tokens_total") - generated < 400
        threads.append(_threads_but_the_far_servers_pool())
    assert threads[1] <= threads[0], f"a cancelled remote stream left a thread behind: {threads[1] - threads[0]}"


def _threads_but_the_far_servers_pool() -> set[tuple[int, str]]:
    """This process's threads, less the far server's request pool: anyio's pool starts a worker when a call
    finds none idle (the last request's may still be closing) and prunes it only at a later call, 10 s on.
    The front's remote client uses no anyio worker, and the far generation's end is counted above."""
    return {(t.ident, t.name) for t in threading.enumerate() if t.name != "AnyIO worker thread"}


def test_an_unreachable_server_gives_a_clear_error(front):
    stream = front.chat("unreachable", ChatRequest(QUESTION))
    stream.text()
    assert stream.record.finish_reason is FinishReason.ERROR
    assert "could not connect" in stream.record.error


def test_structured_output_tools_and_logprobs_pass_through(front):
    fmt = ResponseFormat.model_validate({"type": "json_schema", "json_schema": {"name": "answer", "schema": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"]}}})
    stream = front.chat(None, ChatRequest(QUESTION, SamplingParams(temperature=0, max_new_tokens=40, logprobs=2),
                                          response_format=fmt))
    tokens = [t for delta in stream.deltas() for t in delta.tokens]
    assert isinstance(json.loads(stream.record.text)["city"], str)
    assert tokens and all(len(t.top) == 2 for t in tokens)

    weather = Tool("get_weather", "Get the weather in a city.",
                   json.dumps({"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                               "required": ["city"]}))
    stream = front.chat(None, ChatRequest([Message("user", "What is the weather in Paris?")],
                                          SamplingParams(temperature=0, max_new_tokens=120),
                                          Tools((weather,), "required")))  # bytes
    stream.text()
    [call] = stream.record.tool_calls
    assert call.name == "get_weather" and isinstance(json.loads(call.arguments)["city"], str)
