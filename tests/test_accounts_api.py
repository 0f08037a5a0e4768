"""Accounts on a real server over the stand-in model: logins, keys, whose chats are whose, and the limits.

Accounts are made the way an administrator makes them, with `serge users add`
and `serge keys create` on the server's data dir while it runs.
"""

from __future__ import annotations

import io
import sys
import threading
import time
from contextlib import closing, redirect_stdout
from pathlib import Path

import httpx
import pytest
from conftest import ServerThread, held_port
from standin import stand_in
from test_chats_api import LONG, SHORT, STORY, read_events, send, wait_for

from serge.cli.main import main as serge_main
from serge.settings import Settings
from serge.web.app import build_app


# On the stand-in model (standin.py): nothing here needs the real one.
settings, engine = stand_in("settings", "engine")


PASSWORDS = {"alice": "alice-password", "bob": "bob-password", "carol": "carol-password", "dave": "dave-password"}
REMOTE = {"X-Forwarded-For": "203.0.113.9"}  # relayed by the (trusted, loopback) proxy: not this machine
PAGE = {"Accept": "text/html,application/xhtml+xml"}


def serge(data_dir: Path, *args: str, stdin: str = "") -> str:
    """Run the `serge` command in this process; its stdout."""
    saved, sys.stdin = sys.stdin, io.StringIO(stdin)
    out = io.StringIO()
    try:
        with redirect_stdout(out):
            serge_main([*args, "--data-dir", str(data_dir)])
    finally:
        sys.stdin = saved
    return out.getvalue()


def add_user(data_dir: Path, name: str, *flags: str) -> None:
    serge(data_dir, "users", "add", name, "--password-stdin", *flags, stdin=PASSWORDS[name] + "\n")


def login(url: str, name: str, password: str | None = None, **kwargs) -> httpx.Client:
    client = httpx.Client(base_url=url, timeout=120)
    response = client.post("/login", data={"name": name, "password": password or PASSWORDS[name], "next": "/"},
                           **kwargs)
    assert response.status_code == 303, response.text
    return client


def server_on(tmp_path_factory, settings, engine, name: str, **overrides):
    own = Settings(data_dir=tmp_path_factory.mktemp(name), models_dir=settings.models_dir,
                   torch_threads=settings.torch_threads, **overrides)
    return own, ServerThread(build_app(own, engine), held_port())


@pytest.fixture(scope="module")
def site(settings, engine, tmp_path_factory):
    """A server whose first chat was made before accounts, then alice (admin, via the CLI) and bob."""
    own, running = server_on(tmp_path_factory, settings, engine, "accounts")
    with running as server, httpx.Client(base_url=server.url, timeout=120) as local:
        before = local.post("/api/chats", json={"title": "made before accounts", "settings": SHORT})
        assert before.status_code == 201, before.text
        add_user(own.data_dir, "alice")
        add_user(own.data_dir, "bob")
        yield {"url": server.url, "data_dir": own.data_dir, "old_chat": before.json()["id"]}


@pytest.fixture(scope="module")
def alice(site):
    with closing(login(site["url"], "alice")) as client:
        yield client


@pytest.fixture(scope="module")
def bob(site):
    with closing(login(site["url"], "bob")) as client:
        yield client


def test_the_first_account_takes_over_the_chats_made_before_accounts(site, alice, bob):
    assert [c["id"] for c in alice.get("/api/chats").json()["data"]] == [site["old_chat"]]
    assert bob.get("/api/chats").json()["data"] == []
    assert "admin" in serge(site["data_dir"], "users", "list").splitlines()[0]


@pytest.mark.parametrize("method, path", [
    ("GET", "/api/chats"), ("POST", "/api/chats"), ("GET", "/v1/models"), ("POST", "/v1/chat/completions"),
    ("GET", "/fragments/chats"), ("GET", "/openapi.json"), ("GET", "/api/keys"),
])
def test_once_an_account_exists_the_api_answers_401_without_a_login(site, method, path):
    response = httpx.request(method, site["url"] + path, json={} if method == "POST" else None)
    assert response.status_code == 401
    assert "log in" in response.json()["error"]["message"]
    assert response.headers["www-authenticate"].startswith("Bearer")


@pytest.mark.parametrize("path", ["/", "/c/anything", "/docs", "/settings", "/admin/users"])
def test_once_an_account_exists_pages_send_the_browser_to_log_in(site, path):
    response = httpx.get(site["url"] + path, headers=PAGE)
    assert response.status_code == 303
    assert response.headers["location"].startswith("/login?next=")
    page = httpx.get(site["url"] + response.headers["location"], headers=PAGE)
    assert page.status_code == 200 and 'name="password"' in page.text


def test_a_login_leads_back_to_the_page_asked_for_and_the_menu_says_who(site, alice):
    fresh = httpx.Client(base_url=site["url"], timeout=60)  # closed with the test process
    response = fresh.post("/login", data={"name": "Alice", "password": PASSWORDS["alice"], "next": "/settings"})
    assert response.status_code == 303 and response.headers["location"] == "/settings"
    assert fresh.get("/settings").status_code == 200
    evil = fresh.post("/login", data={"name": "alice", "password": PASSWORDS["alice"], "next": "//evil.example/"})
    assert evil.headers["location"] == "/", "never sent to another host"
    page = alice.get("/", headers=PAGE).text
    assert "Signed in as <strong>alice</strong>" in page and 'action="/logout"' in page


def test_a_wrong_password_is_refused_without_saying_whether_the_user_exists(site):
    def attempt(name: str) -> httpx.Response:
        return httpx.post(f"{site['url']}/login", data={"name": name, "password": "not-the-password"})

    known, unknown = attempt("alice"), attempt("nobody")
    assert known.status_code == unknown.status_code == 401
    assert "set-cookie" not in known.headers and "set-cookie" not in unknown.headers
    assert "Wrong name or password." in known.text
    assert known.text.replace("alice", "NAME") == unknown.text.replace("nobody", "NAME")


def test_the_session_cookie_is_httponly_samesite_and_secure_only_over_https(site):
    plain = httpx.post(f"{site['url']}/login", data={"name": "bob", "password": PASSWORDS["bob"]})
    cookie = plain.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=lax" in cookie and "path=/" in cookie
    assert "secure" not in cookie, "a cookie marked Secure is never sent back over plain http"
    proxied = httpx.post(f"{site['url']}/login", data={"name": "bob", "password": PASSWORDS["bob"]},
                         headers={"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.9"})
    assert "; secure" in proxied.headers["set-cookie"].lower()


def test_logging_out_ends_the_session_and_a_forged_cookie_is_refused(site):
    client = login(site["url"], "bob")
    cookie = client.cookies["serge_session"]
    assert client.get("/api/chats").status_code == 200
    token, _, _ = cookie.rpartition(".")
    assert httpx.get(f"{site['url']}/api/chats", cookies={"serge_session": token + ".forged"}).status_code == 401
    assert client.post("/logout").status_code == 303
    assert httpx.get(f"{site['url']}/api/chats", cookies={"serge_session": cookie}).status_code == 401


def test_a_key_works_for_v1_and_api_until_revoked(site, bob):
    made = bob.post("/settings/keys", data={"name": "laptop script"})
    assert made.status_code == 201
    key = made.text.split('id="new-key" value="')[1].split('"')[0]
    assert key.startswith("sk-serge-")
    assert key not in bob.get("/settings").text, "a key is shown once"
    headers = {"Authorization": f"Bearer {key}"}
    completion = httpx.post(f"{site['url']}/v1/chat/completions", headers=headers, timeout=120,
                            json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert completion.status_code == 200, completion.text
    assert httpx.get(f"{site['url']}/api/chats", headers=headers).status_code == 200
    assert httpx.get(f"{site['url']}/", headers={**headers, **PAGE}).status_code == 303, "keys are for the API"
    listed = bob.get("/api/keys").json()["data"]
    assert [k["name"] for k in listed] == ["laptop script"] and listed[0]["last_used_at"]
    assert "key" not in listed[0]
    assert bob.post(f"/settings/keys/{listed[0]['id']}/revoke").status_code == 303
    refused = httpx.post(f"{site['url']}/v1/chat/completions", headers=headers,
                         json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert refused.status_code == 401 and "not valid" in refused.json()["error"]["message"]


def test_keys_and_passwords_are_stored_as_hashes_only(site, alice):
    key = serge(site["data_dir"], "keys", "create", "alice", "--name", "ci").strip()
    assert httpx.get(f"{site['url']}/api/chats", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    stored = b"".join(p.read_bytes() for p in Path(site["data_dir"]).glob("serge.db*"))
    assert b"sk-serge-" in stored, "the visible prefixes are stored (this check can see the database)"
    assert key.encode() not in stored and key.removeprefix("sk-serge-")[8:].encode() not in stored
    assert PASSWORDS["alice"].encode() not in stored
    assert alice.cookies["serge_session"].rpartition(".")[0].encode() not in stored


def test_one_user_never_reaches_another_users_chat(site, alice, bob):
    chat = alice.post("/api/chats", json={"title": "alice's secret plans", "settings": SHORT}).json()
    _, done = send(alice, f"/api/chats/{chat['id']}/messages", {"content": "The password is swordfish."})
    path = f"/api/chats/{chat['id']}"
    message = done["id"]
    user_message = alice.get(path).json()["messages"][0]["id"]
    attempts = [
        ("GET", path, None), ("PATCH", path, {"title": "mine now"}), ("DELETE", path, None),
        ("GET", f"{path}/export", None), ("POST", f"{path}/messages", {"content": "hello"}),
        ("POST", f"{path}/regenerate", None), ("POST", f"{path}/stop", None),
        ("POST", f"{path}/messages/{user_message}/edit", {"content": "changed"}),
        ("POST", f"{path}/messages/{message}/select", None),
        ("GET", f"/c/{chat['id']}", None), ("GET", f"/c/{chat['id']}/conversation", None),
    ]
    for method, url, body in attempts:
        response = bob.request(method, url, json=body)
        assert response.status_code == 404, f"{method} {url} answered {response.status_code} to another user"
        assert "swordfish" not in response.text
    assert all(c["id"] != chat["id"] for c in bob.get("/api/chats").json()["data"])
    assert bob.get("/api/chats", params={"q": "swordfish"}).json()["data"] == []
    assert "secret plans" not in bob.get("/", headers=PAGE).text
    assert "secret plans" not in bob.get("/fragments/chats").text
    kept = alice.get(path).json()
    assert kept["title"] == "alice's secret plans" and len(kept["messages"]) == 2


def test_users_are_managed_by_admins_only(site, alice, bob):
    assert bob.get("/api/users").status_code == 403
    assert bob.post("/api/users", json={"name": "mallory", "password": "mallory-password"}).status_code == 403
    assert bob.delete("/api/users/alice").status_code == 403
    assert bob.get("/admin/users").status_code == 403
    assert bob.post("/admin/users", data={"name": "mallory", "password": "mallory-password"}).status_code == 403
    made = alice.post("/api/users", json={"name": "erin", "password": "erin-password"})
    assert made.status_code == 201 and made.json()["admin"] is False
    assert {u["name"] for u in alice.get("/api/users").json()["data"]} == {"alice", "bob", "erin"}
    assert alice.post("/api/users", json={"name": "erin", "password": "erin-password"}).status_code == 409
    assert alice.delete("/api/users/erin").json() == {"removed": "erin", "chats_removed": 0}
    assert alice.delete("/api/users/alice").status_code == 409, "the last admin stays while others remain"


def test_metrics_and_health_details_are_for_admins_and_this_machine(site, alice, bob):
    url = site["url"]
    public = httpx.get(f"{url}/api/health", headers=REMOTE)
    assert public.status_code == 200 and public.json()["status"] == "ok"
    assert "device" not in public.json() and "models_loaded" not in public.json()
    assert "device" not in bob.get("/api/health", headers=REMOTE).json()
    assert "device" in alice.get("/api/health", headers=REMOTE).json()
    assert "device" in httpx.get(f"{url}/api/health").json(), "a request made on this machine sees it all"
    assert httpx.get(f"{url}/metrics", headers=REMOTE).status_code == 403
    assert bob.get("/metrics", headers=REMOTE).status_code == 403
    assert alice.get("/metrics", headers=REMOTE).status_code == 200
    assert httpx.get(f"{url}/metrics").status_code == 200


@pytest.fixture(scope="module")
def limited(settings, engine, tmp_path_factory):
    own, running = server_on(tmp_path_factory, settings, engine, "limits", user_requests_per_minute=10,
                             user_max_streams=1)
    with running as server:
        for name in ("carol", "dave"):
            add_user(own.data_dir, name)
        yield server.url


def until_refused(attempt, limit: int = 40) -> tuple[list[int], float]:
    """Status codes up to and with the first 429, and the seconds they took."""
    codes, start = [], time.monotonic()
    while len(codes) < limit and 429 not in codes:
        codes.append(attempt())
    return codes, time.monotonic() - start


def within_budget(codes: list[int], seconds: float, per_minute: int, allowed: int) -> bool:
    """A minute's worth at once, then one more each 60/per_minute s (the bucket refills while we try)."""
    return codes[-1] == 429 and set(codes[:-1]) == {allowed} and \
        per_minute <= len(codes) - 1 <= per_minute + seconds * per_minute / 60 + 1


def test_past_the_requests_per_minute_a_user_gets_429_with_retry_after(limited):
    with closing(login(limited, "carol")) as carol:
        codes, seconds = until_refused(lambda: carol.get("/api/chats").status_code)
        assert within_budget(codes, seconds, per_minute=10, allowed=200), codes
        refused = carol.get("/api/chats")
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
        assert "SERGE_USER_REQUESTS_PER_MINUTE" in refused.json()["error"]["message"]
        assert httpx.get(f"{limited}/api/health").status_code == 200, "the health status is never metered"


def test_past_the_streams_at_once_a_user_gets_429_with_retry_after(limited):
    with closing(login(limited, "dave")) as dave:
        chat = dave.post("/api/chats", json={"settings": LONG}).json()
        started = threading.Event()

        def long_reply():
            with dave.stream("POST", f"/api/chats/{chat['id']}/messages", json={"content": STORY}) as response:
                for kind, _ in read_events(response):
                    if kind == "delta":
                        started.set()

        runner = threading.Thread(target=long_reply)
        runner.start()
        assert started.wait(120), "the first reply never started"
        second = dave.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                         "max_tokens": 2})
        assert second.status_code == 429 and second.headers["retry-after"].isdigit()
        assert "SERGE_USER_MAX_STREAMS" in second.json()["error"]["message"]
        assert dave.post(f"/api/chats/{chat['id']}/stop").status_code == 200
        runner.join(60)
        wait_for(lambda: dave.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}).status_code == 200,
            timeout=30, what="a slot once the first reply stopped")


def test_guessing_passwords_is_slowed_to_a_few_tries_a_minute(limited):
    codes, seconds = until_refused(
        lambda: httpx.post(f"{limited}/login", data={"name": "carol", "password": "a guess"}).status_code)
    assert within_budget(codes, seconds, per_minute=10, allowed=401), codes
