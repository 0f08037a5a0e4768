"""The chat API on a real server over the stand-in model: what a person's chats can rely on."""

from __future__ import annotations

import json
import os
import threading
import time

import httpx
import pytest
from conftest import ServerThread, held_port
from standin import stand_in

from serge.settings import Settings
from serge.web.app import build_app


# On the stand-in model (standin.py): nothing here needs the real one.
settings, engine = stand_in("settings", "engine")


SHORT = {"max_new_tokens": 6, "temperature": 0}
LONG = {"max_new_tokens": 200, "temperature": 0}
STORY = "Write a very long story about a dragon who learns to cook."


def read_events(response: httpx.Response):
    """Yield (event, data) from a server-sent events response."""
    kind = None
    for line in response.iter_lines():
        if line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            yield kind, json.loads(line[5:])


def events_of(client: httpx.Client, path: str, body: dict) -> list[tuple[str, dict]]:
    """POST to a streaming endpoint; every (event, data) it sent."""
    with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200, response.read()
        return list(read_events(response))


def send(client: httpx.Client, path: str, body: dict | None = None) -> tuple[list[str], dict]:
    """POST to a streaming endpoint; the text deltas and the final saved message."""
    deltas, done = [], None
    with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for kind, data in read_events(response):
            if kind == "delta":
                deltas.append(data["text"])
            elif kind == "done":
                done = data["message"]
    assert done is not None, "the stream ended without its final event"
    return deltas, done


def wait_for(predicate, timeout: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (value := predicate()):
            return value
        time.sleep(0.02)  # a predicate is a request or two to a local server: asking often costs little
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def client(settings, engine, tmp_path_factory):
    own = Settings(data_dir=tmp_path_factory.mktemp("chats-api"), models_dir=settings.models_dir,
                   torch_threads=settings.torch_threads)
    with ServerThread(build_app(own, engine), held_port()) as server, \
            httpx.Client(base_url=server.url, timeout=120) as http:
        yield http


def new_chat(client: httpx.Client, **body) -> dict:
    response = client.post("/api/chats", json={"settings": SHORT, **body})
    assert response.status_code == 201, response.text
    return response.json()


@pytest.fixture(scope="module")
def answered(client) -> dict:
    """A chat with one finished turn (read-only for the tests that use it)."""
    chat = new_chat(client, system_prompt="You are brief.")
    send(client, f"/api/chats/{chat['id']}/messages", {"content": "Name a colour of the sky."})
    return client.get(f"/api/chats/{chat['id']}").json()


def test_a_message_streams_back_and_both_turns_are_saved(client):
    chat = new_chat(client)
    assert chat["title"] == "New chat" and chat["messages"] == []
    deltas, done = send(client, f"/api/chats/{chat['id']}/messages", {"content": "Say hi in three words."})
    assert deltas and "".join(deltas) == done["content"]
    assert done["role"] == "assistant" and done["complete"] and done["finish_reason"] in {"stop", "length"}
    assert done["completion_tokens"] >= 1 and done["prompt_tokens"] > 0 and done["tokens_per_s"] is not None

    saved = client.get(f"/api/chats/{chat['id']}").json()
    assert [(m["role"], m["content"]) for m in saved["messages"]] == [
        ("user", "Say hi in three words."), ("assistant", done["content"])]
    assert saved["messages"][1]["model"] and saved["messages"][1]["settings"] == SHORT
    assert saved["title"] == "Say hi in three words."  # named after its first message
    assert client.get("/api/chats").json()["data"][0]["id"] == chat["id"]  # newest first


def test_stop_mid_reply_keeps_the_partial_text_marked_incomplete(client):
    chat = new_chat(client, settings=LONG)
    path = f"/api/chats/{chat['id']}"
    deltas, done = [], []

    def listen():
        with client.stream("POST", f"{path}/messages", json={"content": STORY}) as response:
            for kind, data in read_events(response):
                (deltas.append(data["text"]) if kind == "delta" else done.append(data) if kind == "done" else None)

    listener = threading.Thread(target=listen)
    listener.start()
    wait_for(lambda: len(deltas) >= 2, what="the reply to start")
    busy = client.post(f"{path}/messages", json={"content": "and another"})
    assert busy.status_code == 409 and "stop" in busy.json()["error"]["message"]

    stopped = client.post(f"{path}/stop").json()
    listener.join(60)
    assert stopped["stopped"] and stopped["message"]["status"] == "stopped"
    assert done and done[0]["message"]["status"] == "stopped"
    saved = client.get(path).json()["messages"][-1]
    assert saved["complete"] is False and saved["finish_reason"] == "cancelled"
    assert saved["content"] and saved["content"] == "".join(deltas)
    assert 0 < saved["completion_tokens"] < LONG["max_new_tokens"]
    assert client.post(f"{path}/stop").json() == {"stopped": False, "message": None}


def test_a_client_that_goes_away_stops_its_reply_and_the_text_is_kept(client):
    chat = new_chat(client, settings=LONG)
    path = f"/api/chats/{chat['id']}"
    with client.stream("POST", f"{path}/messages", json={"content": STORY}) as response:
        seen = 0
        for kind, _ in read_events(response):
            seen += kind == "delta"
            if seen >= 2:
                break  # closing the page
    saved = wait_for(lambda: (m := client.get(path).json()["messages"][-1])["status"] != "streaming" and m,
                     what="the reply to be stopped")
    assert saved["status"] == "stopped" and saved["content"] and not saved["complete"]


def test_regenerate_and_edit_keep_every_earlier_version(client):
    chat = new_chat(client, settings={"max_new_tokens": 6, "temperature": 1.0})
    path = f"/api/chats/{chat['id']}"
    _, first = send(client, f"{path}/messages", {"content": "Give me a random word."})
    _, second = send(client, f"{path}/regenerate")
    messages = client.get(path).json()["messages"]
    assert len(messages) == 2 and messages[1]["id"] == second["id"]
    assert messages[1]["alternatives"] == [first["id"], second["id"]]

    back = client.post(f"{path}/messages/{first['id']}/select").json()["messages"]
    assert back[1]["content"] == first["content"]  # flipped back to the earlier reply

    question = messages[0]
    _, edited_reply = send(client, f"{path}/messages/{question['id']}/edit", {"content": "Give me a colour."})
    messages = client.get(path).json()["messages"]
    assert [m["content"] for m in messages] == ["Give me a colour.", edited_reply["content"]]
    assert messages[0]["alternatives"][0] == question["id"]  # the original question is one flip away
    old = client.post(f"{path}/messages/{question['id']}/select").json()["messages"]
    assert old[0]["content"] == "Give me a random word." and len(old) == 2


def test_search_finds_titles_and_message_text(client, answered):
    title_hit = client.get("/api/chats", params={"q": "COLOUR OF THE"}).json()["data"]
    assert answered["id"] in [c["id"] for c in title_hit]
    word = answered["messages"][1]["content"].split()[0]
    assert answered["id"] in [c["id"] for c in client.get("/api/chats", params={"q": word}).json()["data"]]
    assert client.get("/api/chats", params={"q": "zebra-quokka-nowhere"}).json()["data"] == []


def test_export_and_import_round_trip_then_delete(client, answered):
    path = f"/api/chats/{answered['id']}"
    markdown = client.get(f"{path}/export", params={"format": "md"})
    assert markdown.headers["content-type"].startswith("text/markdown")
    assert "Name a colour of the sky." in markdown.text and answered["messages"][1]["content"] in markdown.text
    assert f"## Assistant · {answered['messages'][1]['model']}\n" in markdown.text, "which model wrote the reply"

    exported = client.get(f"{path}/export", params={"format": "json"}).json()
    imported = client.post("/api/chats/import", json=exported)
    assert imported.status_code == 201, imported.text
    copy = imported.json()
    assert copy["id"] != answered["id"]
    assert [(m["role"], m["content"]) for m in copy["messages"]] == [
        (m["role"], m["content"]) for m in answered["messages"]]
    assert (copy["title"], copy["system_prompt"], copy["settings"]) == (
        answered["title"], answered["system_prompt"], answered["settings"])
    assert copy["messages"][1]["completion_tokens"] == answered["messages"][1]["completion_tokens"]

    renamed = client.patch(f"/api/chats/{copy['id']}", json={"title": "The copy"}).json()
    assert renamed["title"] == "The copy" and renamed["settings"] == answered["settings"]
    assert client.delete(f"/api/chats/{copy['id']}").status_code == 204
    assert client.get(f"/api/chats/{copy['id']}").status_code == 404
    assert copy["id"] not in [c["id"] for c in client.get("/api/chats").json()["data"]]
    assert client.get(path).status_code == 200  # the original is untouched


@pytest.mark.parametrize("method, path, body, status, words", [
    ("GET", "/api/chats/nope", None, 404, "no chat"),
    ("POST", "/api/chats/nope/messages", {"content": "hi"}, 404, "no chat"),
    ("PATCH", "/api/chats/nope", {"title": "x"}, 404, "no chat"),
    ("DELETE", "/api/chats/nope", None, 404, "no chat"),
    ("POST", "/api/chats/nope/stop", None, 404, "no chat"),
    ("POST", "/api/chats", {"settings": {"temperature": 5}}, 400, "temperature"),
    ("POST", "/api/chats", {"settings": {"top_p": 0}}, 400, "top_p"),
    ("POST", "/api/chats", {"settings": {"warmth": 1}}, 400, "warmth"),
    ("POST", "/api/chats", {"model": "no-such-model"}, 404, "no-such-model"),
    ("POST", "/api/chats/import", {"chat": {"title": "x"}, "messages": [{"id": "a", "role": "wizard",
                                                                         "content": "x"}]}, 400, "role"),
    ("POST", "/api/chats/import", {"chat": {}, "messages": [{"id": "b", "parent_id": "a", "role": "user",
                                                              "content": "x"}]}, 400, "parent"),
])
def test_bad_requests_get_a_4xx_with_a_message(client, method, path, body, status, words):
    response = client.request(method, path, json=body)
    assert response.status_code == status, response.text
    assert words in response.json()["error"]["message"]


def test_bad_messages_and_settings_on_a_chat_get_a_4xx(client):
    chat = new_chat(client)
    path = f"/api/chats/{chat['id']}"
    for content, words in [("", "empty"), ("   \n", "empty"), ("x" * 100_001, "limit")]:
        response = client.post(f"{path}/messages", json={"content": content})
        assert response.status_code == 400 and words in response.json()["error"]["message"]
    assert client.post(f"{path}/messages", json={}).status_code == 400
    assert client.patch(path, json={"settings": {"max_new_tokens": 0}}).status_code == 400
    assert client.patch(path, json={"title": "  "}).status_code == 400
    assert client.post(f"{path}/regenerate").status_code == 400  # nothing to answer yet
    assert client.get(f"{path}/export", params={"format": "pdf"}).status_code == 400
    assert client.post(f"{path}/messages/nope/edit", json={"content": "x"}).status_code == 404
    assert client.get(path).json()["messages"] == []  # nothing invalid was saved


@pytest.mark.postgres
@pytest.mark.skipif(not os.environ.get("SERGE_TEST_POSTGRES_URL"), reason="SERGE_TEST_POSTGRES_URL is not set")
def test_chats_are_kept_in_postgresql(settings, engine, tmp_path):
    from sqlalchemy import text

    from serge.store import Database
    from serge.store.tables import Base

    db = Database(os.environ["SERGE_TEST_POSTGRES_URL"])
    with db.engine.begin() as conn:  # a clean schema: other tests leave accounts behind (login mode)
        Base.metadata.drop_all(conn)
        conn.execute(text("DROP TABLE IF EXISTS alembic_version"))
    db.close()
    own = Settings(data_dir=tmp_path, models_dir=settings.models_dir, torch_threads=settings.torch_threads,
                   database_url=os.environ["SERGE_TEST_POSTGRES_URL"])
    with ServerThread(build_app(own, engine), held_port()) as server, \
            httpx.Client(base_url=server.url, timeout=120) as http:
        chat = new_chat(http)
        _, done = send(http, f"/api/chats/{chat['id']}/messages", {"content": "Hello from PostgreSQL"})
        saved = http.get(f"/api/chats/{chat['id']}").json()
        assert [m["content"] for m in saved["messages"]] == ["Hello from PostgreSQL", done["content"]]
        assert chat["id"] in [c["id"] for c in http.get("/api/chats", params={"q": "postgresql"}).json()["data"]]
        assert http.delete(f"/api/chats/{chat['id']}").status_code == 204
