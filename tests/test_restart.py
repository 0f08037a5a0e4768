"""`serge serve` as a real process: chats outlive restarts, and a kill mid-reply loses nothing the user wrote."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import httpx
import pytest
from conftest import free_port, models_dir
from test_chats_api import LONG, SHORT, STORY, read_events, send, wait_for

from serge.settings import Settings

pytestmark = pytest.mark.real_model


class Serve:
    """`python -m serge serve` on a data dir, until stopped or killed."""

    def __init__(self, data_dir, log_path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log_path, "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "serge", "serve", "--port", str(self.port), "--data-dir", str(data_dir),
             "--models-dir", str(models_dir()), "--threads", str(Settings().torch_threads)],  # this worker's share
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        self.client = httpx.Client(base_url=self.url, timeout=120)

    def __enter__(self):
        def healthy():
            assert self.process.poll() is None, f"serge serve exited with {self.process.returncode}"
            try:
                return self.client.get("/api/health").status_code == 200
            except httpx.HTTPError:
                return False
        wait_for(healthy, timeout=180, what="serge serve to become healthy")
        return self

    def __exit__(self, *exc):
        self.client.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


@pytest.fixture
def data_dir(tmp_path):
    return tmp_path / "data"


def test_chats_survive_a_restart_and_a_kill_mid_reply(data_dir, tmp_path):
    log = tmp_path / "serve.log"
    with Serve(data_dir, log) as first:
        http = first.client
        kept = http.post("/api/chats", json={"settings": SHORT}).json()
        _, answer = send(http, f"/api/chats/{kept['id']}/messages", {"content": "Hello there"})
        story = http.post("/api/chats", json={"settings": LONG}).json()

        deltas = []

        def listen():
            try:
                with http.stream("POST", f"/api/chats/{story['id']}/messages", json={"content": STORY}) as r:
                    for kind, data in read_events(r):
                        if kind == "delta":
                            deltas.append(data["text"])
            except httpx.HTTPError:
                pass  # the server is killed under it

        def saved_while_streaming() -> bool:
            messages = http.get(f"/api/chats/{story['id']}").json()["messages"]
            reply = messages[-1] if messages else {}
            return reply.get("role") == "assistant" and reply["status"] == "streaming" and bool(reply["content"])

        listener = threading.Thread(target=listen, daemon=True)
        listener.start()
        wait_for(saved_while_streaming, timeout=120, what="the streaming reply to be saved once")
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(30)
        listener.join(30)
    seen = "".join(deltas)

    with Serve(data_dir, log) as second:
        http = second.client
        listed = [c["id"] for c in http.get("/api/chats").json()["data"]]
        assert set(listed) == {kept["id"], story["id"]}
        before = http.get(f"/api/chats/{kept['id']}").json()["messages"]
        assert [(m["role"], m["content"]) for m in before] == [("user", "Hello there"),
                                                                ("assistant", answer["content"])]

        messages = http.get(f"/api/chats/{story['id']}").json()["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant"]
        assert messages[0]["content"] == STORY  # the user's message was committed before generation
        cut = messages[1]
        assert cut["status"] == "interrupted" and cut["complete"] is False
        assert cut["content"] and seen.startswith(cut["content"])  # saved as it streamed

        # the chat goes on normally after the interruption
        http.patch(f"/api/chats/{story['id']}", json={"settings": SHORT})
        _, more = send(http, f"/api/chats/{story['id']}/messages", {"content": "Go on."})
        assert more["status"] in {"complete", "length"}
        after_kill = http.get(f"/api/chats/{story['id']}").json()["messages"]
    assert second.process.returncode == 0 or second.process.returncode == -signal.SIGTERM

    with Serve(data_dir, log) as third:  # a clean restart shows exactly the same chats
        http = third.client
        assert [c["id"] for c in http.get("/api/chats").json()["data"]] == [story["id"], kept["id"]]
        again = http.get(f"/api/chats/{story['id']}").json()["messages"]
        assert [(m["id"], m["content"], m["status"]) for m in again] == [
            (m["id"], m["content"], m["status"]) for m in after_kill]


NOTES = "Here are my notes on tides, currents and the moon. " * 60 + "What do they say?"


def test_a_long_conversation_is_not_prefilled_again_after_a_clean_restart(data_dir, tmp_path):
    """Its keys and values are kept on disk when the server stops (SIGTERM) and taken back when it starts."""
    log = tmp_path / "serve.log"
    body = {"model": "smollm2-135m-instruct", "max_tokens": 6, "temperature": 0,
            "messages": [{"role": "user", "content": NOTES}]}
    with Serve(data_dir, log) as first:
        answer = first.client.post("/v1/chat/completions", json=body).json()
    assert first.process.returncode == 0, "a stop (SIGTERM) closes the engine, then exits"
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert list((data_dir / "kv-cache").glob("*/manifest.json")), "nothing was kept on disk at the stop"

    body["messages"] += [answer["choices"][0]["message"], {"role": "user", "content": "And the moon?"}]
    with Serve(data_dir, log) as second:
        again = second.client.post("/v1/chat/completions", json=body).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= answer["usage"]["prompt_tokens"]
    assert "Took back 1 conversation(s)" in log.read_text()
