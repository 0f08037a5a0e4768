"""Admission control over HTTP: a full server answers 503 with Retry-After, and nothing is lost."""

from __future__ import annotations

import json

import httpx
import pytest

from serge.settings import Settings
from serge.web.app import build_app

from conftest import ServerThread, held_port
from standin import NAME, standin_engine

LONG = {"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 200, "ignore_eos": True,
        "temperature": 0, "stream": True}


def _one_slot(settings, data_dir, max_queue: int, **more):
    """A server of its own over a stand-in model that decodes one generation at a time, at 10 ms a token
    (a 200-token reply holds the slot for 2 s)."""
    own = Settings(data_dir=data_dir, models_dir=settings.models_path, port=held_port(), default_model=NAME,
                   max_running=1, max_queue=max_queue, **more)
    with standin_engine(own, step_s=0.01) as engine, ServerThread(build_app(own, engine), own.port) as running:
        yield running.url


@pytest.fixture(scope="module")
def tiny_server(standin_settings, tmp_path_factory):
    """One slot and no queue."""
    yield from _one_slot(standin_settings, tmp_path_factory.mktemp("tiny"), max_queue=0)


def test_a_full_server_answers_503_with_retry_after(tiny_server):
    with httpx.stream("POST", f"{tiny_server}/v1/chat/completions", json=LONG, timeout=60) as first:
        lines = first.iter_lines()
        while '"content"' not in (line := next(lines)) or '"content": ""' in line:
            pass  # until the first reply's text arrives: it is generating, and holds the only slot
        second = httpx.post(f"{tiny_server}/v1/chat/completions", timeout=60,
                            json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        chat = httpx.post(f"{tiny_server}/api/chats", json={}, timeout=30).json()
        third = httpx.post(f"{tiny_server}/api/chats/{chat['id']}/messages", json={"content": "Hello?"}, timeout=60)
    assert second.status_code == 503
    assert int(second.headers["Retry-After"]) >= 1
    assert "busy" in second.json()["error"]["message"]
    assert third.status_code == 503 and "Retry-After" in third.headers
    saved = httpx.get(f"{tiny_server}/api/chats/{chat['id']}", timeout=30).json()
    assert [m["content"] for m in saved["messages"] if m["role"] == "user"] == ["Hello?"], "the user's message is kept"


@pytest.fixture(scope="module")
def impatient_server(standin_settings, tmp_path_factory):
    """One slot, room to wait, and half a second of patience."""
    yield from _one_slot(standin_settings, tmp_path_factory.mktemp("impatient"), max_queue=4, queue_timeout_s=0.5)


def test_a_request_that_waits_out_the_queue_is_a_503_with_retry_after_never_a_500(impatient_server):
    import anthropic
    import openai

    longer = {**LONG, "max_tokens": 800}
    with httpx.stream("POST", f"{impatient_server}/v1/chat/completions", json=longer, timeout=60) as first:
        lines = first.iter_lines()
        while '"content"' not in (line := next(lines)) or '"content": ""' in line:
            pass  # the first reply holds the only slot for 8 s at least
        client = openai.OpenAI(base_url=f"{impatient_server}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.APIStatusError) as waited:
            client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
        claude = anthropic.Anthropic(base_url=impatient_server, api_key="unused", max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as also:
            claude.messages.create(model=NAME, max_tokens=2, messages=[{"role": "user", "content": "Hi"}])
        ollama = httpx.post(f"{impatient_server}/api/chat", timeout=60, json={
            "model": NAME, "messages": [{"role": "user", "content": "Hi"}], "stream": False})
    assert waited.value.status_code == 503 and int(waited.value.response.headers["Retry-After"]) >= 1
    assert "waiting for a free slot" in waited.value.message
    assert also.value.status_code == 503 and also.value.body["error"]["type"] == "overloaded_error"
    assert ollama.status_code == 503 and "waiting for a free slot" in ollama.json()["error"]


@pytest.fixture(scope="module")
def one_slot_server(standin_settings, tmp_path_factory):
    """One slot, and room for others to wait."""
    yield from _one_slot(standin_settings, tmp_path_factory.mktemp("one-slot"), max_queue=4)


def _events(response):
    kind = None
    for line in response.iter_lines():
        if line.startswith("event: "):
            kind = line[len("event: "):]
        elif line.startswith("data: ") and kind:
            yield kind, json.loads(line[len("data: "):])


def test_a_waiting_reply_learns_its_place_in_line_then_streams(one_slot_server):
    chat = httpx.post(f"{one_slot_server}/api/chats", json={}, timeout=30).json()
    seen = []
    with httpx.stream("POST", f"{one_slot_server}/v1/chat/completions", json=LONG, timeout=60) as first:
        assert first.status_code == 200, first.read()
        lines = first.iter_lines()
        while '"content"' not in (line := next(lines)) or '"content": ""' in line:
            pass  # until the first reply's text arrives: it is generating, and holds the only slot
        with httpx.stream("POST", f"{one_slot_server}/api/chats/{chat['id']}/messages",
                          json={"content": "Hello?"}, timeout=60) as waiting:
            events = _events(waiting)
            for kind, data in events:
                seen.append(kind)
                if kind == "queued":
                    assert data == {"ahead": 0}
                    break
            first.close()  # the slot frees: the waiting reply runs
            for kind, data in events:
                seen.append(kind)
    assert seen[:2] == ["start", "queued"]
    assert "delta" in seen and seen[-1] == "done"
    assert data["message"]["status"] in {"complete", "length"} and data["message"]["content"]
