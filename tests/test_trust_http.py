"""Issue 18's promises through the real HTTP server: the login throttle, key revocation from the
admin page, near-zero temperatures, and the small 4xx answers. On the stand-in model (standin.py):
none of them is the model's.
"""

from __future__ import annotations

import time
from contextlib import closing

import httpx
import pytest
from conftest import ServerThread, held_port
from standin import stand_in
from test_accounts_api import PASSWORDS, add_user, login
from test_chats_api import send

from serge.settings import Settings
from serge.web.pages.accounts import LOGIN_ATTEMPTS_PER_MINUTE, LOGIN_ATTEMPTS_PER_PROXY_MINUTE
from serge.web.app import build_app

settings, engine, server = stand_in("settings", "engine", "server")

HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def guarded(settings, engine, tmp_path_factory):
    """A server with accounts (an admin and two users), behind the default trusted proxy, 127.0.0.1."""
    own = Settings(data_dir=tmp_path_factory.mktemp("trust"), models_dir=settings.models_dir,
                   torch_threads=settings.torch_threads)
    with ServerThread(build_app(own, engine), held_port()) as server:
        for name in ("alice", "bob", "carol"):
            add_user(own.data_dir, name, *(("--admin",) if name == "alice" else ()))
        yield server.url


def guesses(url: str, names, addresses, limit: int = 80) -> list[int]:
    """Wrong passwords, one per (name, forwarded address), until the first 429."""
    codes = []
    for i in range(limit):
        headers = {"X-Forwarded-For": addresses(i)} if addresses else {}
        codes.append(httpx.post(f"{url}/login", data={"name": names(i), "password": "a guess"}, headers=headers,
                                timeout=60).status_code)
        if codes[-1] == 429:
            break
    return codes


def test_rotating_x_forwarded_for_from_the_trusted_proxy_does_not_walk_the_throttle(guarded):
    started = time.monotonic()
    one_name = guesses(guarded, lambda i: "bob", lambda i: f"198.51.100.{i + 1}")
    assert one_name[-1] == 429 and set(one_name[:-1]) == {401}, one_name
    assert LOGIN_ATTEMPTS_PER_MINUTE <= len(one_name) - 1 <= LOGIN_ATTEMPTS_PER_MINUTE + 2, "per account name"
    sprayed = guesses(guarded, lambda i: f"nobody{i}", lambda i: f"203.0.113.{i + 1}")
    assert sprayed[-1] == 429 and set(sprayed[:-1]) == {401}, sprayed
    spent = len(one_name) - 1 + len(sprayed) - 1
    refilled = (time.monotonic() - started) * LOGIN_ATTEMPTS_PER_PROXY_MINUTE / 60  # a busy machine takes a while
    assert spent <= LOGIN_ATTEMPTS_PER_PROXY_MINUTE + 3 + refilled, f"the proxy's connection allowed {spent} guesses"
    refused = httpx.post(f"{guarded}/login", data={"name": "carol", "password": PASSWORDS["carol"]},
                         headers={"X-Forwarded-For": "192.0.2.77"})
    assert refused.status_code == 429 and refused.headers["retry-after"].isdigit()


def test_the_admin_pages_password_reset_revokes_that_users_keys(guarded):
    with closing(login(guarded, "alice")) as alice:
        made = httpx.post(f"{guarded}/api/keys", json={"name": "old"}, cookies=alice.cookies).json()["key"]
        bearer = {"Authorization": f"Bearer {made}"}
        assert httpx.get(f"{guarded}/api/chats", headers=bearer).status_code == 200
        reset = alice.post("/admin/users/alice/password", data={"password": "a brand new password"})
        assert reset.status_code == 200 and "1 API key(s) of theirs were revoked" in reset.text, reset.text
        assert httpx.get(f"{guarded}/api/chats", headers=bearer).status_code == 401


def test_a_near_zero_temperature_answers_and_a_chat_that_stores_it_still_replies(server):
    for temperature in (1e-40, 1e-300, 5e-324):
        answer = httpx.post(f"{server}/v1/chat/completions", timeout=120,
                            json={"messages": HI, "max_tokens": 4, "temperature": temperature})
        assert answer.status_code == 200, answer.text
    with httpx.Client(base_url=server, timeout=120) as client:
        chat = client.post("/api/chats", json={"settings": {"temperature": 1e-40, "max_new_tokens": 4}}).json()
        assert chat["settings"]["temperature"] == 0
        for _ in range(2):
            _, message = send(client, f"/api/chats/{chat['id']}/messages", {"content": "Hi"})
            assert message["complete"] and message["finish_reason"] in ("stop", "length"), message


def test_max_completion_tokens_zero_is_a_400_like_max_tokens_zero(server):
    for field in ("max_tokens", "max_completion_tokens"):
        answer = httpx.post(f"{server}/v1/chat/completions", json={"messages": HI, field: 0})
        assert answer.status_code == 400 and answer.json()["error"]["param"] == field, answer.text


def test_a_body_without_content_type_is_told_to_send_json(server):
    answer = httpx.post(f"{server}/v1/chat/completions", content=b'{"messages": [{"role": "user", "content": "Hi"}]}')
    assert answer.status_code == 415, answer.text
    assert "Content-Type: application/json" in answer.json()["error"]["message"]
    assert httpx.post(f"{server}/api/chats", content=b"{}").status_code == 415


@pytest.mark.parametrize("label", ["../../etc/passwd", "<img src=x onerror=alert(1)>", "a" * 150])
def test_an_import_may_not_label_a_message_with_anything_but_a_model_name(server, label):
    body = {"format": "serge.chat", "version": 1, "chat": {"title": "imported"}, "messages": [
        {"id": "q", "role": "user", "content": "Hi"},
        {"id": "a", "parent_id": "q", "role": "assistant", "content": "Hello", "model": label}]}
    answer = httpx.post(f"{server}/api/chats/import", json=body)
    assert answer.status_code == 400 and "messages.1.model" in answer.json()["error"]["message"], answer.text
    chat_label = httpx.post(f"{server}/api/chats/import", json={**body, "messages": [], "chat": {"model": label}})
    assert chat_label.status_code == 400, chat_label.text
    fine = httpx.post(f"{server}/api/chats/import", json={**body, "messages": [
        {**body["messages"][0]}, {**body["messages"][1], "model": "SmolLM2-135M-Instruct"}]})
    assert fine.status_code == 201, fine.text
