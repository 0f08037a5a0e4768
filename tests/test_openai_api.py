"""The OpenAI-compatible API on a real server over the stand-in model: replies, streams, and clear 4xx errors."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from openai import OpenAI

from serge.engine import resolve_device

from standin import NAME as MODEL, cancelled as _cancelled, stand_in


# On the stand-in model (standin.py): nothing here needs the real one.
settings, engine, server = stand_in("settings", "engine", "server")


HELLO = [{"role": "user", "content": "What is the capital of France?"}]


def post(server, body, **kwargs):
    return httpx.post(f"{server}/v1/chat/completions", json=body, timeout=120, **kwargs)


def test_health_says_ready_with_device_and_model(server, settings):
    body = httpx.get(f"{server}/api/health").json()
    plan = resolve_device(settings.device, settings.dtype, settings.quantization)
    assert body["status"] == "ok"
    assert (body["device"], body["dtype"]) == (plan.device, plan.dtype_name), "what the device resolver chose"
    assert body["default_model"] == MODEL  # a model made in code is never in the registry's models_loaded
    assert body["version"]


def test_models_lists_the_installed_default(server):
    ids = [m["id"] for m in httpx.get(f"{server}/v1/models").json()["data"]]
    assert MODEL in ids


def test_a_reply_carries_usage_finish_reason_and_seed(server):
    reply = post(server, {"model": MODEL, "messages": HELLO, "temperature": 0, "max_tokens": 12})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"].strip()
    assert choice["finish_reason"] in {"stop", "length"}
    assert body["usage"]["prompt_tokens"] > 0 and body["usage"]["completion_tokens"] > 0
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
    assert isinstance(body["seed"], int)


def test_stop_and_seed_are_honoured(server):
    body = {"messages": HELLO, "temperature": 1.0, "seed": 7, "max_tokens": 12}
    first = post(server, body).json()["choices"][0]["message"]["content"]
    assert post(server, body).json()["choices"][0]["message"]["content"] == first
    greedy = post(server, {"messages": HELLO, "temperature": 0, "max_tokens": 20}).json()["choices"][0]["message"]
    word = greedy["content"].split()[2]  # a word the greedy reply is sure to reach
    stopped = post(server, {"messages": HELLO, "temperature": 0, "stop": [word], "max_tokens": 20}).json()
    assert stopped["choices"][0]["message"]["content"] == greedy["content"][: greedy["content"].index(word)]
    assert stopped["choices"][0]["finish_reason"] == "stop"


def test_the_official_openai_client_streams_a_reply(server):
    client = OpenAI(base_url=f"{server}/v1", api_key="not-needed")
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=HELLO, stream=True, temperature=0, max_tokens=12,
        stream_options={"include_usage": True},
        extra_body={"top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1},
    ))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    whole = client.chat.completions.create(model=MODEL, messages=HELLO, temperature=0, max_tokens=12,
                                           extra_body={"top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1})
    assert text == whole.choices[0].message.content and text.strip()
    for seed, extra in ((3, {"top_k": 1}), (4, {"min_p": 0.999})):  # the extras reach the sampler
        hot = client.chat.completions.create(model=MODEL, messages=HELLO, temperature=1.5, max_tokens=12, seed=seed,
                                             extra_body=extra)
        greedy = client.chat.completions.create(model=MODEL, messages=HELLO, temperature=0, max_tokens=12)
        assert hot.choices[0].message.content == greedy.choices[0].message.content, extra
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in {"stop", "length"}
    assert chunks[-1].usage.completion_tokens > 0


def test_a_stream_ends_with_done(server):
    with httpx.stream("POST", f"{server}/v1/chat/completions", timeout=60,
                      json={"messages": HELLO, "stream": True, "max_tokens": 4}) as reply:
        lines = [line for line in reply.iter_lines() if line]
    assert reply.headers["content-type"].startswith("text/event-stream")
    assert lines[-1] == "data: [DONE]"
    first = json.loads(lines[0].removeprefix("data: "))
    assert first["choices"][0]["delta"]["role"] == "assistant"


BAD_REQUESTS = {
    "unknown model": ({"model": "no-such-model", "messages": HELLO}, 404, "not installed"),
    "bad role": ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.0.role"),
    "no messages": ({"messages": []}, 400, "messages"),
    "temperature out of range": ({"messages": HELLO, "temperature": 3}, 400, "temperature"),
    "top_p out of range": ({"messages": HELLO, "top_p": 0}, 400, "top_p"),
    "negative max_tokens": ({"messages": HELLO, "max_tokens": 0}, 400, "max_tokens"),
    "max_tokens beyond the context": ({"messages": HELLO, "max_tokens": 10_000_000}, 400, "context window"),
    "five stop strings": ({"messages": HELLO, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    "n above the most choices": ({"messages": HELLO, "n": 9}, 400, "less than or equal to 8"),
    "stream_options without stream": ({"messages": HELLO, "stream_options": {"include_usage": True}}, 400,
                                      "stream_options"),
    "not json": (None, 400, "JSON"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_input_gets_a_4xx_that_says_what_to_fix(server, case):
    body, status, words = BAD_REQUESTS[case]
    if body is None:
        reply = httpx.post(f"{server}/v1/chat/completions", content=b"{not json", timeout=30,
                           headers={"content-type": "application/json"})
    else:
        reply = post(server, body)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert words.lower() in error["message"].lower() and error["type"] == "invalid_request_error"


def test_an_oversized_body_is_refused_with_413(server, settings):
    big = {"messages": [{"role": "user", "content": "x" * (settings.max_request_bytes + 10)}]}
    reply = post(server, big)
    assert reply.status_code == 413
    assert "larger than" in reply.json()["error"]["message"]


def test_a_client_that_disconnects_cancels_its_generation(server, engine):
    cancelled_before = _cancelled(engine)
    with httpx.stream("POST", f"{server}/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "Write a very long essay."}],
        "stream": True, "max_tokens": 500, "ignore_eos": True, "temperature": 0,
    }) as reply:
        for i, _ in enumerate(reply.iter_lines()):
            if i >= 4:
                break
    deadline = time.monotonic() + 20
    while _cancelled(engine) == cancelled_before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _cancelled(engine) == cancelled_before + 1, "the abandoned generation was not cancelled"
    health = httpx.get(f"{server}/api/health").json()
    assert health["models"][MODEL]["running"] == 0


def test_metrics_are_exposed_for_prometheus(server):
    post(server, {"messages": HELLO, "max_tokens": 2})
    text = httpx.get(f"{server}/metrics").text
    for name in ["serge_requests_total", "serge_generated_tokens_total", "serge_time_to_first_token_seconds_bucket",
                 "serge_inter_token_latency_seconds_bucket", "serge_queue_length", "serge_active_sequences"]:
        assert f"{name}{{" in text, name


def test_the_api_docs_describe_the_endpoints(server):
    spec = httpx.get(f"{server}/openapi.json", timeout=60).json()
    assert {"/v1/chat/completions", "/v1/models", "/api/health"} <= set(spec["paths"])
    fields = spec["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert {"top_k", "min_p", "repetition_penalty", "seed", "stop"} <= set(fields)
    assert httpx.get(f"{server}/docs", timeout=60).status_code == 200
