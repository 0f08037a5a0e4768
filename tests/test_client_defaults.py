"""What clients send by default is taken: a body without a Content-Type on Ollama's routes (litellm's Ollama
providers send none), and `stream_options.include_usage` on /v1/completions (simonw/llm sends it for every
completion model). The cross-site checks still hold where the 415 no longer does."""

from __future__ import annotations

import json

import httpx
import pytest
from conftest import server_of_its_own
from standin import NAME as MODEL, stand_in

settings, engine = stand_in("settings", "engine")
server = server_of_its_own()

HELLO = [{"role": "user", "content": "Hello"}]


def bare(server: str, path: str, body: dict, **headers) -> httpx.Response:
    request = httpx.Request("POST", f"{server}{path}", content=json.dumps(body).encode(), headers=headers)
    request.headers.pop("Content-Type", None)  # raw bytes: httpx adds none, as litellm's ollama_chat/ sends none
    assert "content-type" not in request.headers
    with httpx.Client(timeout=60) as client:
        return client.send(request)


@pytest.mark.parametrize(("path", "body"), [
    ("/api/chat", {"model": MODEL, "messages": HELLO, "stream": False, "options": {"num_predict": 8}}),
    ("/api/generate", {"model": MODEL, "prompt": "Hello", "stream": False, "options": {"num_predict": 8}}),
    ("/api/show", {"model": MODEL}),
])
def test_ollamas_routes_read_a_body_without_a_content_type_as_json(server, path, body):
    answer = bare(server, path, body)
    assert answer.status_code == 200, answer.text


def test_a_streamed_ollama_chat_without_a_content_type_streams(server):
    answer = bare(server, "/api/chat", {"model": MODEL, "messages": HELLO, "options": {"num_predict": 8}})
    assert answer.status_code == 200, answer.text
    lines = [json.loads(line) for line in answer.text.splitlines() if line]
    assert lines[-1]["done"] is True and len(lines) > 1


def test_without_a_content_type_a_cross_site_post_to_ollama_is_still_refused(server):
    body = {"model": MODEL, "messages": HELLO, "stream": False}
    assert bare(server, "/api/chat", body, Origin="http://evil.example").status_code == 403
    assert bare(server, "/api/chat", body, **{"Sec-Fetch-Site": "cross-site"}).status_code == 403


def test_serges_own_api_still_wants_json_said(server):
    answer = bare(server, "/api/chats", {"title": "x"})
    assert answer.status_code == 415 and "Content-Type" in answer.json()["error"]["message"]


def completion_events(server: str, **body) -> list[dict]:
    with httpx.stream("POST", f"{server}/v1/completions", timeout=60, json={
            "model": MODEL, "prompt": "Once", "max_tokens": 6, "stream": True, **body}) as reply:
        assert reply.status_code == 200, reply.read()
        data = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def test_streamed_completions_end_with_their_usage_when_asked(server):
    events = completion_events(server, prompt=["Once", "Twice"], n=2, stream_options={"include_usage": True})
    last = events[-1]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] > 0
    assert last["usage"]["total_tokens"] == last["usage"]["prompt_tokens"] + last["usage"]["completion_tokens"]
    whole = httpx.post(f"{server}/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": ["Once", "Twice"], "max_tokens": 6, "n": 2, "seed": 1}).json()["usage"]
    assert last["usage"]["prompt_tokens"] == whole["prompt_tokens"]
    assert all("usage" not in e for e in events[:-1])


def test_streamed_completions_without_include_usage_send_none(server):
    assert all("usage" not in e for e in completion_events(server, stream_options={"include_usage": False}))
    assert all("usage" not in e for e in completion_events(server))


def test_stream_options_without_a_stream_is_a_400_naming_it(server):
    answer = httpx.post(f"{server}/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": "Once", "stream_options": {"include_usage": True}})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "stream_options"


def test_llms_completion_request_is_taken(server):
    """simonw/llm's OpenAI completion models send this (llm/default_plugins/openai_models.py)."""
    events = completion_events(server, prompt="Say hi", max_tokens=8, stream_options={"include_usage": True})
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) and events[-1]["usage"]
