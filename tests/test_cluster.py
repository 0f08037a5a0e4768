"""Two `serge serve` processes on one PostgreSQL database behind a real HAProxy (Debian's, round robin), as
docs/running-for-others.md sets them up: one service, whichever process a request reaches.

The processes are real `python -m serge serve` subprocesses with the shared `secret.key` copied into each
data dir and one `files/` folder between them (a shared mount, on two machines). Their model is the
stand-in (tests/standin.py), served by a Serge in this test process and named to both as a remote model,
so no real model is loaded; the knowledge indexer embeds with the bundled embedding model. It skips only
where PostgreSQL (SERGE_TEST_POSTGRES_URL) or HAProxy is missing; `.ci/run` installs and starts both.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from conftest import POSTGRES_URL, ServerThread, fresh_database, free_port, models_dir
from standin import NAME, standin_engine
from test_chats_api import read_events, wait_for

from serge.accounts import Accounts, load_secret
from serge.store import AccountStore
from serge.web.app import build_app

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
pytestmark = [pytest.mark.postgres,
              pytest.mark.skipif(not POSTGRES_URL, reason="SERGE_TEST_POSTGRES_URL is not set (CI starts PostgreSQL)"),
              pytest.mark.skipif(not Path(HAPROXY).exists(), reason="HAProxy is not installed (apt-get install haproxy)")]

PASSWORD = "correct horse battery staple"
MAX_STREAMS = 2
LONG = {"max_new_tokens": 3000, "temperature": 0}  # about a minute at the stand-in's pace: a Stop ends it
HAPROXY_CONFIG = """\
global
    maxconn 256
defaults
    mode http
    timeout connect 2s
    timeout client 10m
    timeout server 10m
    option http-server-close
    option forwardfor
    option redispatch
    retries 3
frontend serge
    bind 127.0.0.1:{port}
    default_backend serge
backend serge
    balance roundrobin
    option httpchk GET /api/health
    http-response set-header X-Serge-Server %s
    server a 127.0.0.1:{a} check inter 300ms fall 1 rise 2
    server b 127.0.0.1:{b} check inter 300ms fall 1 rise 2
"""


class Serve:
    """`python -m serge serve` on its own data dir and port, over the shared database."""

    def __init__(self, name: str, data_dir: Path, env: dict, log_dir: Path) -> None:
        self.name, self.port = name, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log_dir / f"serve-{name}.log", "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "serge", "serve", "--port", str(self.port), "--data-dir", str(data_dir),
             "--models-dir", str(models_dir()), "--threads", "1"],
            stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def healthy(self) -> bool:
        assert self.process.poll() is None, f"serge serve {self.name} exited with {self.process.returncode}"
        try:
            return httpx.get(f"{self.url}/api/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(90)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


class Cluster:
    def __init__(self, url: str, processes: dict[str, Serve], key: str, bob_key: str) -> None:
        self.url, self.processes, self.key, self.bob_key = url, processes, key, bob_key

    def client(self, key: str | None = None, base: str | None = None) -> httpx.Client:
        return httpx.Client(base_url=base or self.url, timeout=120,
                            headers={"Authorization": f"Bearer {key or self.key}"})


@pytest.fixture(scope="module")
def model_server(standin_settings, tmp_path_factory):
    """The stand-in, at a steady ~50 tokens/s, served by a Serge in this process (no accounts: local calls)."""
    with standin_engine(standin_settings, step_s=0.02) as engine:
        own = standin_settings.model_copy(update={"data_dir": tmp_path_factory.mktemp("model-server"),
                                                  "port": free_port()})
        with ServerThread(build_app(own, engine), own.port) as running:
            yield running.url


@pytest.fixture(scope="module")
def cluster(model_server, tmp_path_factory):
    base = tmp_path_factory.mktemp("cluster")
    database = fresh_database(POSTGRES_URL)  # an empty schema, as a new install's
    accounts = Accounts(AccountStore(database))
    alice = accounts.add_user("alice", PASSWORD, admin=True)
    bob = accounts.add_user("bob", PASSWORD)
    key, bob_key = accounts.create_key(alice, "cluster")[1], accounts.create_key(bob, "cluster")[1]
    database.close()
    # The data dirs: the same secret.key in each (logins made on one hold on the other) and one files/ folder.
    shared_files = base / "shared-files"
    shared_files.mkdir(mode=0o700)
    dirs = {name: base / f"data-{name}" for name in "ab"}
    load_secret(dirs["a"])
    dirs["b"].mkdir(mode=0o700)
    shutil.copy2(dirs["a"] / "secret.key", dirs["b"] / "secret.key")
    for folder in dirs.values():
        (folder / "files").symlink_to(shared_files)
    env = {**os.environ, "SERGE_DATABASE_URL": POSTGRES_URL, "SERGE_DEFAULT_MODEL": NAME,
           "SERGE_REMOTE_MODELS": json.dumps({NAME: {"url": f"{model_server}/v1"}}),
           "SERGE_USER_MAX_STREAMS": str(MAX_STREAMS), "SERGE_SHUTDOWN_TIMEOUT_S": "60",
           "SERGE_LOG_LEVEL": "info"}  # SERGE_DRAIN_S: 2 s, as with any server database
    processes = {name: Serve(name, folder, env, base) for name, folder in dirs.items()}
    proxy = None
    try:
        for process in processes.values():
            wait_for(process.healthy, timeout=180, what=f"serge serve {process.name} to become healthy")
        port = free_port()
        config = base / "haproxy.cfg"
        config.write_text(HAPROXY_CONFIG.format(port=port, a=processes["a"].port, b=processes["b"].port))
        proxy = subprocess.Popen([HAPROXY, "-f", str(config), "-db"], stdout=open(base / "haproxy.log", "ab"),
                                 stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"

        def both_up():
            try:
                served = {httpx.get(f"{url}/api/health", timeout=5).headers.get("x-serge-server") for _ in range(4)}
            except httpx.HTTPError:
                return False
            return served == {"a", "b"}

        wait_for(both_up, timeout=60, what="HAProxy to send requests to both processes")
        yield Cluster(url, processes, key, bob_key)
    finally:
        if proxy is not None:
            proxy.terminate()
            proxy.wait(10)
        for process in processes.values():
            process.stop()


def _served_by(response: httpx.Response) -> str:
    return response.headers["x-serge-server"]


def _new_chat(client: httpx.Client) -> str:
    return client.post("/api/chats", json={"settings": LONG}).json()["id"]


def _start_long_reply(client: httpx.Client, chat_id: str):
    """A long reply streaming in the chat: (chat id, the streamed response, its events, the process running it)."""
    response = client.send(client.build_request("POST", f"/api/chats/{chat_id}/messages",
                                                json={"content": "Tell me a long story."}), stream=True)
    assert response.status_code == 200, response.read()
    events = read_events(response)
    assert next(events)[0] == "start"
    assert next(events)[0] in ("delta", "queued")
    return chat_id, response, events, _served_by(response)


def test_a_login_and_a_key_made_through_one_process_hold_on_both(cluster):
    page = httpx.Client(base_url=cluster.url, timeout=60)
    response = page.post("/login", data={"name": "alice", "password": PASSWORD, "next": "/"})
    assert response.status_code == 303
    seen = {_served_by(page.get("/api/chats")) for _ in range(4)}  # round robin: each process in turn
    assert seen == {"a", "b"}
    with cluster.client() as client:
        made = client.post("/api/keys", json={"name": "made on one"})
        assert made.status_code == 201
        new_key = made.json()["key"]
        with cluster.client(new_key) as with_new:
            answers = [with_new.get("/api/chats") for _ in range(4)]
        assert {r.status_code for r in answers} == {200} and {_served_by(r) for r in answers} == {"a", "b"}
        chat = client.post("/api/chats", json={"title": "seen by both"}).json()
        assert {(_served_by(r), r.status_code) for r in (client.get(f"/api/chats/{chat['id']}") for _ in range(2))} \
            == {("a", 200), ("b", 200)}


def test_a_stop_sent_to_the_other_process_stops_its_reply_at_once(cluster):
    with cluster.client() as client:
        chat_id, response, events, owner = _start_long_reply(client, _new_chat(client))
        other = cluster.processes["b" if owner == "a" else "a"]
        with cluster.client(base=other.url) as elsewhere:
            shown = elsewhere.get(f"/api/chats/{chat_id}").json()["messages"][-1]
            assert shown["status"] == "streaming"  # "is a reply running", asked of the other process
            busy = elsewhere.post(f"/api/chats/{chat_id}/regenerate")
            assert busy.status_code == 409, busy.text
            asked = time.monotonic()
            stopped = elsewhere.post(f"/api/chats/{chat_id}/stop").json()
            answered = time.monotonic() - asked
        ended = None
        for kind, data in events:
            if kind == "done":
                ended = data["message"]
        response.close()
        assert stopped["stopped"] is True and stopped["message"]["status"] == "stopped"
        assert ended is not None and ended["status"] == "stopped" and ended["id"] == stopped["message"]["id"]
        assert ended["completion_tokens"] < LONG["max_new_tokens"]
        assert answered < 5, f"the stop took {answered:.2f} s"
        print(f"\nstop through the other process: answered (reply saved) in {answered * 1000:.0f} ms")
        again = client.send(client.build_request("POST", f"/api/chats/{chat_id}/regenerate"), stream=True)
        assert again.status_code == 200  # the chat is free, from either process
        assert next(read_events(again))[0] == "start"
        assert client.post(f"/api/chats/{chat_id}/stop").json()["stopped"] is True
        again.close()


def test_a_user_s_streams_are_limited_across_both_processes(cluster):
    with cluster.client(cluster.bob_key) as bob:
        chats = [_new_chat(bob) for _ in range(MAX_STREAMS)]
        running = [_start_long_reply(bob, chat_id) for chat_id in chats]  # one after the other: one on each
        try:
            assert {r[3] for r in running} == {"a", "b"}  # one on each process
            refused = [bob.post("/v1/chat/completions", json={"model": NAME, "messages": [
                {"role": "user", "content": "hi"}], "max_tokens": 4}) for _ in range(2)]
            assert [r.status_code for r in refused] == [429, 429]
            assert {_served_by(r) for r in refused} == {"a", "b"}
            assert refused[0].json()["error"]["code"] == "too_many_streams"
        finally:
            for chat_id, response, _, _ in running:
                bob.post(f"/api/chats/{chat_id}/stop")
                response.close()
        answered = bob.post("/v1/chat/completions", json={"model": NAME, "messages": [
            {"role": "user", "content": "hi"}], "max_tokens": 4})
        assert answered.status_code == 200, answered.text


def test_a_file_indexed_by_one_process_is_searched_by_the_other(cluster):
    with cluster.client() as client:
        collection = client.post("/api/knowledge", json={"name": "handbook"}).json()
        uploaded = client.post(f"/api/knowledge/{collection['id']}/files", files={"file": (
            "handbook.md", b"# Handbook\n\nThe office cat is called Marmalade and sleeps by the window.\n",
            "text/markdown")})
        assert uploaded.status_code == 201, uploaded.text
        where = _served_by(uploaded)

        def indexed():
            files = client.get(f"/api/knowledge/{collection['id']}/files").json()["data"]
            assert files[0]["state"] != "error", files[0]
            return files[0]["state"] == "indexed"

        wait_for(indexed, timeout=120, what="the file to be indexed")
        other = cluster.processes["b" if where == "a" else "a"]
        with cluster.client(base=other.url) as elsewhere:
            chat = elsewhere.post("/api/chats", json={"knowledge": ["handbook"],
                                                      "settings": {"max_new_tokens": 8}}).json()
            with elsewhere.stream("POST", f"/api/chats/{chat['id']}/messages",
                                  json={"content": "What is the office cat called?"}) as response:
                done = [d for k, d in read_events(response) if k == "done"][0]["message"]
        assert done["sources"] and "Marmalade" in done["sources"][0]["passage"]


def test_sigterm_lets_one_process_finish_its_replies_while_the_other_takes_new_ones(cluster):
    """Last: it ends process a."""
    finite = {"max_new_tokens": 150, "temperature": 0}  # ~3 s each at the stand-in's pace
    outcomes: dict[int, dict] = {}

    def stream(i: int, client: httpx.Client, chat_id: str) -> None:
        got = {"deltas": 0}
        try:
            with client.stream("POST", f"/api/chats/{chat_id}/messages",
                               json={"content": f"Tell me a long story, number {i}."}) as response:
                got["status"], got["server"] = response.status_code, response.headers.get("x-serge-server")
                for kind, data in read_events(response):
                    if kind == "delta":
                        got["deltas"] += 1
                    elif kind == "done":
                        got["done"] = data["message"]
        except httpx.HTTPError as exc:
            got["error"] = repr(exc)
        outcomes[i] = got

    a = cluster.processes["a"]
    with cluster.client() as client:
        chats = [client.post("/api/chats", json={"settings": finite}).json()["id"] for _ in range(MAX_STREAMS)]
        threads = [threading.Thread(target=stream, args=(i, client, chat)) for i, chat in enumerate(chats)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)  # both replies streaming, one on each process
        # A connection the balancer has just opened to a, its request not sent yet: closed unanswered, were a
        # to stop listening at once (HAProxy answers that with a 502; it retries only a refused connection).
        just_opened = socket.create_connection(("127.0.0.1", a.port), timeout=10)
        a.process.send_signal(signal.SIGTERM)
        later = []
        deadline = time.monotonic() + 5
        with cluster.client(cluster.bob_key) as bob:
            def draining() -> bool:  # a itself, still serving
                health = httpx.get(f"{a.url}/api/health", timeout=5)
                return (health.status_code, health.json()["status"]) == (503, "draining")

            wait_for(draining, timeout=1.5, what="a's /api/health to say it is draining")
            just_opened.sendall(b"GET /login HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            with just_opened:
                assert just_opened.recv(64).startswith(b"HTTP/1.1 200"), "a closed a connection it had taken"
            while time.monotonic() < deadline:  # new requests meanwhile: all answered, by b
                later.append(bob.post("/v1/chat/completions", json={"model": NAME, "max_tokens": 4, "messages": [
                    {"role": "user", "content": "hi"}]}))
        for thread in threads:
            thread.join(60)
        assert a.process.wait(60) in (0, -signal.SIGTERM)  # uvicorn raises the signal again once done
    assert sorted(outcomes) == list(range(MAX_STREAMS))
    assert {o.get("server") for o in outcomes.values()} == {"a", "b"}
    for i, outcome in outcomes.items():
        assert "error" not in outcome and outcome["status"] == 200, outcome
        assert outcome["done"]["status"] in ("complete", "length"), outcome  # finished, not cut
        assert outcome["done"]["completion_tokens"] == finite["max_new_tokens"] or \
            outcome["done"]["status"] == "complete", outcome
    assert later and {r.status_code for r in later} == {200}, [(r.status_code, r.text[:200]) for r in later]
    assert {_served_by(r) for r in later[len(later) // 2:]} == {"b"}
