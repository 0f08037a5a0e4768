"""Faults a server left running will meet: a model that will not load, a database that is locked or full,
a remote server that hangs or drops. Each time the user is told, nothing is lost silently, and the server
goes on serving. (A kill mid-reply is tests/test_restart.py's.)

Everything but the good model is real (that one is the stand-in, standin.py): an installed model has its
weights file cut in half (as an interrupted copy or a failing disk leaves it); another connection holds the
SQLite file locked past the busy timeout; SQLite's own page limit stands in for a full disk (no small file system can be mounted here), so the error
is SQLite's real SQLITE_FULL; the far servers are sockets on 127.0.0.1 that never answer, or hang up.
"""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
from conftest import CHROMIUM, MODEL as REAL_MODEL, ServerThread, models_dir, held_port
from standin import NAME as MODEL, standin_engine
from sqlalchemy import event
from test_chats_api import read_events, wait_for

from serge.engine import ModelLibrary
from serge.engine.models.library import MANIFEST, folder_name
from serge.settings import RemoteModel, Settings
from serge.store.db import sqlite_driver
from serge.web.app import build_app

BROKEN = "broken-model"
REMOTE_TIMEOUT_S = 1.0  # each hang test waits it out: long enough to be a silence, short enough not to cost
SHORT = {"max_new_tokens": 6, "temperature": 0}
LONG = {"max_new_tokens": 120, "temperature": 0, "ignore_eos": True}


class FarServer:
    """A socket on 127.0.0.1 that reads each request, then runs `answer(connection)`."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.open: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.open.append(conn)
            conn.recv(65536)
            threading.Thread(target=self.answer, args=(conn,), daemon=True).start()

    def close(self) -> None:
        self.sock.close()
        for conn in self.open:
            conn.close()


def never_answers(conn: socket.socket) -> None:
    pass  # the connection stays open, silent, until the test ends


def answers_then_hangs_up(conn: socket.socket) -> None:
    def chunk(data: str) -> bytes:
        body = f"data: {data}\n\n".encode()
        return f"{len(body):x}\r\n".encode() + body + b"\r\n"

    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    for piece in ("Half of", " an answer"):
        conn.sendall(chunk('{"choices": [{"index": 0, "delta": {"content": "%s"}, "finish_reason": null}]}' % piece))
        time.sleep(0.1)
    conn.close()  # mid-stream: no finish reason, no [DONE], no closing chunk


def install_broken_model(models: Path) -> None:
    """The bundled model as the library installed it, under another name, then its weights cut in half.
    (Its installed folder is copied rather than imported again: reading the tokenizer out of the GGUF takes
    the library 15 s here. The real model's file is read, never loaded.)"""
    good = ModelLibrary(models_dir()).find(REAL_MODEL)
    folder = models / folder_name(BROKEN)
    folder.mkdir()
    for file in good.folder.iterdir():
        if file.is_file() and file.suffix != ".gguf" and file != good.folder / MANIFEST:  # no copy made from it
            shutil.copyfile(file, folder / file.name)
    manifest = {**json.loads((good.folder / MANIFEST).read_text()), "name": BROKEN, "facts": good.facts.to_json()}
    (folder / MANIFEST).write_text(json.dumps(manifest))  # the facts as this library reads them, from the whole file
    with open(good.gguf_path, "rb") as whole:
        (folder / good.gguf_path.name).write_bytes(whole.read(good.gguf_path.stat().st_size // 2))


@pytest.fixture(scope="module")
def faulty(tmp_path_factory, settings):
    """A server with the good model (the stand-in, the default), a broken one in its library, two bad far
    servers and a short database busy timeout."""
    root = tmp_path_factory.mktemp("faults")
    (root / "models").mkdir()
    install_broken_model(root / "models")
    hang, drop = FarServer(never_answers), FarServer(answers_then_hangs_up)
    own = Settings(data_dir=root / "data", models_dir=root / "models", torch_threads=settings.torch_threads,
                   remote_models={"far-hang": RemoteModel(url=hang.url), "far-drop": RemoteModel(url=drop.url)},
                   remote_timeout_s=REMOTE_TIMEOUT_S, database_busy_timeout_s=0.5, default_model=MODEL)
    with standin_engine(own) as engine:
        app = build_app(own, engine)
        with ServerThread(app, held_port()) as server, httpx.Client(base_url=server.url, timeout=120) as http:
            http.app, http.db_path = app, own.data_dir / "serge.db"
            yield http
    hang.close()
    drop.close()


def new_chat(client: httpx.Client, **body) -> str:
    response = client.post("/api/chats", json={"settings": SHORT, **body})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def stream_reply(client: httpx.Client, path: str, body: dict | None = None, on_first_delta=None):
    """(status, the JSON error or None, the deltas, the final message or None)."""
    deltas, done = [], None
    with client.stream("POST", path, json=body) as response:
        if response.status_code != 200:
            return response.status_code, response.read() and response.json(), deltas, None
        for kind, data in read_events(response):
            if kind == "delta":
                deltas.append(data["text"])
                if len(deltas) == 1 and on_first_delta:
                    on_first_delta()
            elif kind == "done":
                done = data["message"]
    return 200, None, deltas, done


def still_serves_the_good_model(client: httpx.Client) -> None:
    assert client.get("/api/health").json()["status"] == "ok"
    chat = new_chat(client)
    status, error, deltas, done = stream_reply(client, f"/api/chats/{chat}/messages", {"content": "Say hi."})
    assert status == 200 and done["status"] in ("complete", "length") and done["content"], (error, done)


# --- a model that will not load ---------------------------------------------------------------------------

def test_a_model_that_will_not_load_gets_a_clear_503_on_the_api_and_the_server_goes_on(faulty):
    for _ in range(2):  # and again: a failed load leaves nothing half-loaded behind
        response = faulty.post("/v1/chat/completions", json={
            "model": BROKEN, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
        assert response.status_code == 503, response.text
        error = response.json()["error"]
        assert error["code"] == "model_load_failed" and error["param"] == "model"
        assert BROKEN in error["message"] and f"serge models rm {BROKEN}" in error["message"]
        assert str(faulty.db_path.parent) not in error["message"], "no paths in the message"
    still_serves_the_good_model(faulty)


def test_a_chat_on_a_model_that_will_not_load_keeps_the_message_and_says_what_to_do(faulty):
    chat = new_chat(faulty, model=BROKEN)
    status, error, _, _ = stream_reply(faulty, f"/api/chats/{chat}/messages", {"content": "Are you there?"})
    assert status == 503, error
    assert error["error"]["code"] == "model_load_failed"  # the page shows error.message (sse.js errorText)
    assert BROKEN in error["error"]["message"] and "Regenerate" in error["error"]["message"]
    messages = faulty.get(f"/api/chats/{chat}").json()["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert messages[0]["content"] == "Are you there?", "what the user wrote is kept"
    assert messages[1]["status"] == "error" and BROKEN in messages[1]["error"]

    # the way out the message gives: another model, then Regenerate
    assert faulty.patch(f"/api/chats/{chat}", json={"model": MODEL}).status_code == 200
    status, _, deltas, done = stream_reply(faulty, f"/api/chats/{chat}/regenerate")
    assert status == 200 and done["status"] in ("complete", "length") and "".join(deltas) == done["content"]


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's Chromium is not installed")
def test_the_chat_page_says_the_model_would_not_load_not_that_it_is_busy(faulty, page):
    expect = pytest.importorskip("playwright.sync_api").expect
    chat = new_chat(faulty, model=BROKEN)
    page.goto(f"{faulty.base_url}/c/{chat}")
    box = page.get_by_label("Message")
    box.fill("Hello?")
    box.press("Enter")
    status = page.locator("#status")
    expect(status).to_contain_text(f"model '{BROKEN}' could not be loaded", timeout=60_000)
    expect(status).to_contain_text("Regenerate")
    assert "busy" not in status.inner_text()
    assert status.get_attribute("data-kind") == "error"
    still_serves_the_good_model(faulty)


# --- the database locked or full ----------------------------------------------------------------------------

class HeldLock:
    """Another program writing to the database: it holds SQLite's write lock until released. Through Serge's own
    driver: a second SQLite library in one process does not see the first one's locks (POSIX locks are per process)."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite_driver().connect(path, isolation_level=None)

    def take(self) -> None:
        self.db.execute("BEGIN EXCLUSIVE")

    def release(self) -> None:
        if self.db.in_transaction:
            self.db.execute("ROLLBACK")
        self.db.close()


def test_a_locked_database_refuses_the_message_with_a_503_and_keeps_nothing_half_done(faulty):
    chat = new_chat(faulty)
    lock = HeldLock(faulty.db_path)
    lock.take()
    try:
        status, error, _, _ = stream_reply(faulty, f"/api/chats/{chat}/messages", {"content": "Locked out?"})
    finally:
        lock.release()
    assert status == 503, error
    assert error["error"]["code"] == "database_unavailable" and "locked" in error["error"]["message"]
    assert "nothing was saved" in error["error"]["message"]
    assert faulty.get(f"/api/chats/{chat}").json()["messages"] == [], "told nothing was saved, and nothing was"
    status, _, _, done = stream_reply(faulty, f"/api/chats/{chat}/messages", {"content": "And now?"})
    assert status == 200 and done["status"] in ("complete", "length")


def test_a_reply_that_cannot_be_saved_is_reported_then_saved_once_the_lock_goes(faulty, monkeypatch):
    monkeypatch.setattr("serge.chats.replies.reply.SAVE_RETRY_EVERY_S", 0.1)  # its 2 s between tries, waited out here
    chat = new_chat(faulty, settings=LONG)
    lock = HeldLock(faulty.db_path)
    try:
        status, error, deltas, done = stream_reply(faulty, f"/api/chats/{chat}/messages",
                                                   {"content": "Count from one to a hundred."}, lock.take)
    finally:
        lock.release()
    assert status == 200, error
    assert done["status"] == "error" and "could not be saved" in done["error"] and "locked" in done["error"]
    assert done["completion_tokens"] == LONG["max_new_tokens"], "a failed save does not cut the reply short"

    def saved():
        reply = faulty.get(f"/api/chats/{chat}").json()["messages"][-1]
        return reply if reply["status"] != "streaming" else None

    reply = wait_for(saved, timeout=30, what="the reply to be saved once the lock is gone")
    assert reply["content"] == "".join(deltas), "the whole reply is kept, not the last flush"
    assert reply["status"] == "length" and reply["completion_tokens"] == LONG["max_new_tokens"]
    status, _, _, done = stream_reply(faulty, f"/api/chats/{chat}/messages", {"content": "Thanks."})
    assert status == 200 and done["status"] in ("complete", "length"), "the chat goes on"


def test_a_full_disk_refuses_the_message_with_a_503_and_the_chat_goes_on_once_there_is_room(faulty):
    engine = faulty.app.state.services.chats.store.db.engine

    def full(dbapi_connection, _record):  # the file may not grow by a page: what a full disk does to SQLite
        pages = dbapi_connection.execute("PRAGMA page_count").fetchone()[0]
        dbapi_connection.execute(f"PRAGMA max_page_count={pages}")

    chat = new_chat(faulty)
    event.listen(engine, "connect", full)
    engine.dispose()  # new connections, each with the limit
    try:
        status, error, _, _ = stream_reply(faulty, f"/api/chats/{chat}/messages", {"content": "word " * 1500})
    finally:
        event.remove(engine, "connect", full)
        engine.dispose()
    assert status == 503, error
    assert error["error"]["code"] == "database_unavailable" and "full" in error["error"]["message"]
    assert faulty.get(f"/api/chats/{chat}").json()["messages"] == []
    status, _, _, done = stream_reply(faulty, f"/api/chats/{chat}/messages", {"content": "word " * 1500})
    assert status == 200 and done["status"] in ("complete", "length")


# --- a remote server that hangs or drops -----------------------------------------------------------------

def test_a_remote_server_that_never_answers_ends_the_reply_with_a_timeout(faulty):
    chat = new_chat(faulty, model="far-hang")
    started = time.monotonic()
    status, error, deltas, done = stream_reply(faulty, f"/api/chats/{chat}/messages", {"content": "Hello?"})
    took = time.monotonic() - started
    assert status == 200, error
    assert done["status"] == "error" and f"no answer for {REMOTE_TIMEOUT_S:g} s" in done["error"]
    assert REMOTE_TIMEOUT_S <= took < REMOTE_TIMEOUT_S + 10
    assert faulty.get(f"/api/chats/{chat}").json()["messages"][-1]["status"] == "error"
    still_serves_the_good_model(faulty)


def test_the_api_answers_502_with_the_reason_when_a_remote_server_never_answers(faulty):
    started = time.monotonic()
    response = faulty.post("/v1/chat/completions", json={"model": "far-hang",
                                                         "messages": [{"role": "user", "content": "Hello?"}]})
    assert time.monotonic() - started < REMOTE_TIMEOUT_S + 10
    assert response.status_code == 502, response.text
    error = response.json()["error"]
    assert error["code"] == "remote_model_failed" and f"no answer for {REMOTE_TIMEOUT_S:g} s" in error["message"]


def test_a_remote_server_that_hangs_up_mid_reply_leaves_the_partial_reply_marked_error(faulty):
    chat = new_chat(faulty, model="far-drop")
    status, error, deltas, done = stream_reply(faulty, f"/api/chats/{chat}/messages", {"content": "Hello?"})
    assert status == 200, error
    assert "".join(deltas) == "Half of an answer"
    assert done["status"] == "error" and "closed the connection" in done["error"]
    saved = faulty.get(f"/api/chats/{chat}").json()["messages"][-1]
    assert saved["content"] == "Half of an answer" and saved["status"] == "error" and not saved["complete"]
    still_serves_the_good_model(faulty)
