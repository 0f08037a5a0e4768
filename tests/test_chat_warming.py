"""A chat opened in the page is warmed: on a real server over the stand-in, the GET answers at once, the
chat's next prompt is prefilled behind it, and the send prefills only the new message; off, nothing is.

The scheduler's rules for a warm are tests/test_warming.py's; the real model's, tests/test_warming_real.py's.
"""

from __future__ import annotations

import time

import httpx
import pytest
from conftest import own_server
from standin import NAME, standin_engine
from test_chats_api import send, wait_for

from serge.chats.service import ChatService
from serge.engine import SchedulerLimits

CHUNK = 64
STEP_S = 0.04  # a pass: a chat of ~7,000 byte tokens warms in some 4 s


@pytest.fixture(scope="module")
def engine(standin_settings):
    with standin_engine(standin_settings, limits=SchedulerLimits(max_running=4, prefill_chunk=CHUNK),
                        step_s=STEP_S) as engine:
        yield engine


@pytest.fixture(scope="module")
def server(standin_settings, engine, tmp_path_factory):
    with own_server(standin_settings, engine, tmp_path_factory.mktemp("warming")) as url:
        yield url


@pytest.fixture(scope="module")
def cold_server(standin_settings, engine, tmp_path_factory):
    with own_server(standin_settings, engine, tmp_path_factory.mktemp("not-warming"), warm_chats=False) as url:
        yield url


def _value(engine, metric: str) -> float:
    return engine.metrics.registry.get_sample_value(metric, {"model": NAME}) or 0.0


def _import_chat(http: httpx.Client, n_messages: int) -> str:
    messages, parent = [], None
    for i in range(n_messages):
        role = "user" if i % 2 == 0 else "assistant"
        messages.append({"id": f"m{i}", "parent_id": parent, "role": role,
                         "content": f"Message {i}: the trail climbs past the old quarry to the ridge"})
        parent = f"m{i}"
    made = http.post("/api/chats/import", json={
        "format": "serge.chat", "version": 1, "messages": messages,
        "chat": {"title": "long", "system_prompt": f"You are chat {time.time_ns()}.",  # no other chat's prefix
                 "settings": {"max_new_tokens": 8, "temperature": 0}}})
    assert made.status_code == 201, made.text
    return made.json()["id"]


def _settled(engine) -> float:
    """The warmed tokens once no warm has run for a while."""
    last, deadline = -1.0, time.monotonic() + 120
    while (now := _value(engine, "serge_warmed_tokens_total")) != last and time.monotonic() < deadline:
        last = now
        time.sleep(0.3)
    return now


def test_an_opened_chat_is_warmed_behind_a_get_that_answers_at_once_and_its_send_prefills_only_the_new_message(
        standin_settings, engine, tmp_path, monkeypatch):
    warm = ChatService.warm

    def slow(self, *args):  # building the prompt of a huge chat on a busy machine: the GET must not wait for it
        time.sleep(2.0)
        return warm(self, *args)

    monkeypatch.setattr(ChatService, "warm", slow)
    with own_server(standin_settings, engine, tmp_path) as server, httpx.Client(base_url=server, timeout=120) as http:
        chat_id = _import_chat(http, 300)  # ~19,000 byte tokens: cut to the window
        engine.model().scheduler.forget_prefixes()
        before = _settled(engine)
        started = time.monotonic()
        opened = http.get(f"/api/chats/{chat_id}")
        answered = time.monotonic() - started
        assert opened.status_code == 200 and len(opened.json()["messages"]) == 300
        warm = wait_for(lambda: _value(engine, "serge_warmed_tokens_total") - before > 4000, what="the warm")
        assert answered < 1.5, f"the GET took {answered:.2f} s: it waited for the warm"
        assert wait_for(lambda: _settled(engine) - before > 6000, what="the warm to finish") and warm
        warmed = _settled(engine) - before
        assert warmed * STEP_S / CHUNK > 4 * answered  # the GET did not wait for the warm

        prefilled = _value(engine, "serge_prefilled_tokens_total")
        reused = _value(engine, "serge_prefix_cache_tokens_total")
        _, done = send(http, f"/api/chats/{chat_id}/messages", {"content": "Where were we?"})
        assert done["content"] and done["status"] in ("complete", "length"), done
        new = _value(engine, "serge_prefilled_tokens_total") - prefilled
        assert _value(engine, "serge_prefix_cache_tokens_total") - reused == done["prompt_tokens"] - new >= warmed
        assert new < 64, f"the send prefilled {new} tokens: more than its new message"
        assert done["dropped_messages"] > 0  # the chat was cut to the window, and the cut did not move


def test_opening_a_chat_twice_warms_it_once(server, engine):
    with httpx.Client(base_url=server, timeout=120) as http:
        chat_id = _import_chat(http, 40)
        http.get(f"/api/chats/{chat_id}")
        wait_for(lambda: _settled(engine) and engine.model().scheduler.pending == 0, what="the first warm")
        once = _settled(engine)
        for _ in range(3):
            assert http.get(f"/api/chats/{chat_id}").status_code == 200
        assert _settled(engine) == once


def test_with_warming_off_opening_a_chat_warms_nothing(cold_server, engine):
    with httpx.Client(base_url=cold_server, timeout=120) as http:
        chat_id = _import_chat(http, 40)
        before = _settled(engine)
        assert http.get(f"/api/chats/{chat_id}").status_code == 200
        time.sleep(1.0)
        assert _settled(engine) == before


def test_another_users_chat_is_neither_shown_nor_warmed(server, engine):
    with httpx.Client(base_url=server, timeout=120) as http:
        before = _settled(engine)
        assert http.get("/api/chats/not-a-chat-of-theirs").status_code == 404
        time.sleep(0.5)
        assert _settled(engine) == before


def test_a_chat_shown_in_the_page_is_warmed_and_again_after_each_reply(server, engine):
    with httpx.Client(base_url=server, timeout=120) as http:
        chat_id = _import_chat(http, 300)
        before = _settled(engine)
        assert http.get(f"/c/{chat_id}").status_code == 200  # the page opens the chat
        wait_for(lambda: _settled(engine) - before > 4000, what="the warm of the chat opened")
        for question in ("Where were we?", "And after that?"):
            prefilled = _value(engine, "serge_prefilled_tokens_total")
            _, done = send(http, f"/api/chats/{chat_id}/messages", {"content": question})
            new = _value(engine, "serge_prefilled_tokens_total") - prefilled
            assert new < 64, f"the send of {question!r} prefilled {new} tokens: more than its new message"
            warmed = _settled(engine)
            assert http.get(f"/c/{chat_id}/conversation").status_code == 200  # the page shows the reply
            wait_for(lambda: _settled(engine) > warmed, what="the warm after the reply")


def test_a_file_attached_to_a_chat_warms_it(server, engine):
    with httpx.Client(base_url=server, timeout=120) as http:
        chat_id = _import_chat(http, 40)
        before = _settled(engine)
        uploaded = http.post(f"/api/chats/{chat_id}/files",
                             files={"file": ("notes.txt", b"The quarry closed in 1950.\n", "text/plain")})
        assert uploaded.status_code == 201, uploaded.text
        wait_for(lambda: _settled(engine) > before, what="the warm after the file")
