"""Bad input on every endpoint that takes a body: a clear 4xx in the JSON error shape, never a 500.

Each body here is sent as raw bytes, as a careless or hostile client would, to a real server.
"""

from __future__ import annotations

import httpx
import pytest
from conftest import server_of_its_own
from standin import stand_in



# On the stand-in model (standin.py): nothing here needs the real one.
settings, engine = stand_in("settings", "engine")


LONE = '"\\ud800"'  # a JSON escape for half of a surrogate pair: parses in Python, is not text


server = server_of_its_own(max_request_bytes=64_000)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def paths(http) -> dict[str, str]:
    """Real addresses for every endpoint with a body."""
    exported = {"chat": {"title": "Target", "settings": {"max_new_tokens": 2, "temperature": 0}},
                "messages": [{"id": "q", "role": "user", "content": "Hi."},
                             {"id": "a", "parent_id": "q", "role": "assistant", "content": "Hello."}]}
    chat = http.post("/api/chats/import", json=exported).json()
    question = chat["messages"][0]["id"]
    return {
        "completions": "/v1/chat/completions",
        "create": "/api/chats",
        "patch": f"/api/chats/{chat['id']}",
        "messages": f"/api/chats/{chat['id']}/messages",
        "edit": f"/api/chats/{chat['id']}/messages/{question}/edit",
        "import": "/api/chats/import",
    }


def send(http, method: str, path: str, body: bytes, content_type: str | None = "application/json"):
    headers = {"Content-Type": content_type} if content_type else {}
    return http.request(method, path, content=body, headers=headers)


def assert_error(response: httpx.Response, status: int, words: str, param: str | None = None) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert words in error["message"] and error["type"] == "invalid_request_error", error
    if param is not None:
        assert error["param"] == param, error


def user(content: str) -> str:
    return '{"messages": [{"role": "user", "content": %s}], "max_tokens": 2}' % content


def imported(title: str = '"t"', content: str = '"x"') -> str:
    return ('{"chat": {"title": %s}, "messages": [{"id": "q", "role": "user", "content": %s}]}'
            % (title, content))


SURROGATES = {
    "completion message": ("POST", "completions", user(LONE), "messages.0.content"),
    "completion text part": ("POST", "completions", user('[{"type": "text", "text": %s}]' % LONE),
                             "messages.0.content.0.text"),
    "completion model name": ("POST", "completions", '{"model": %s, "messages": [{"role": "user", "content": "x"}]}'
                              % LONE, "model"),
    "completion stop": ("POST", "completions", '{"messages": [{"role": "user", "content": "x"}], "stop": [%s]}'
                        % LONE, "stop.0"),
    "new chat title": ("POST", "create", '{"title": %s}' % LONE, "title"),
    "new chat system prompt": ("POST", "create", '{"system_prompt": %s}' % LONE, "system_prompt"),
    "new chat model": ("POST", "create", '{"model": %s}' % LONE, "model"),
    "new chat setting": ("POST", "create", '{"settings": {"stop": [%s]}}' % LONE, "settings.stop.0"),
    "new chat setting name": ("POST", "create", '{"settings": {%s: 1}}' % LONE, "settings"),
    "rename": ("PATCH", "patch", '{"title": "a\\udc00b"}', "title"),
    "system prompt change": ("PATCH", "patch", '{"system_prompt": %s}' % LONE, "system_prompt"),
    "message": ("POST", "messages", '{"content": "pair reversed \\udc00\\ud800"}', "content"),
    "edited message": ("POST", "edit", '{"content": %s}' % LONE, "content"),
    "imported title": ("POST", "import", imported(title=LONE), "chat.title"),
    "imported message": ("POST", "import", imported(content=LONE), "messages.0.content"),
}


@pytest.mark.parametrize("case", list(SURROGATES))
def test_a_lone_surrogate_anywhere_is_a_400_naming_the_field(http, paths, case):
    method, endpoint, body, field = SURROGATES[case]
    assert_error(send(http, method, paths[endpoint], body.encode()), 400, "lone surrogate", field)


def test_a_full_surrogate_pair_is_ordinary_text(http, paths):
    reply = send(http, "POST", paths["create"], b'{"title": "smile \\ud83d\\ude00"}')
    assert reply.status_code == 201 and reply.json()["title"] == "smile \U0001F600"


ENDPOINTS = [("POST", "completions"), ("POST", "create"), ("PATCH", "patch"), ("POST", "messages"),
             ("POST", "edit"), ("POST", "import")]


@pytest.mark.parametrize(("method", "endpoint"), ENDPOINTS)
def test_a_body_that_is_not_json_is_told_to_send_json(http, paths, method, endpoint):
    assert_error(send(http, method, paths[endpoint], b"{content: hello"), 400, "send application/json")
    assert_error(send(http, method, paths[endpoint], b'{"title": "\xff"}'), 400, "UTF-8")
    assert_error(send(http, method, paths[endpoint], b"content=hello", "application/x-www-form-urlencoded"),
                 415, "send application/json")
    assert_error(send(http, method, paths[endpoint], b"hello", "text/plain; charset=utf-8"),
                 415, "send application/json")


@pytest.mark.parametrize(("method", "endpoint"), ENDPOINTS)
def test_a_chunked_body_over_the_limit_is_413_not_a_parse_error(http, paths, method, endpoint):
    def chunks():  # no Content-Length: the server learns the size only as the bytes arrive
        yield b'{"content": "'
        for _ in range(100):
            yield b"x" * 1000
        yield b'"}'

    response = http.request(method, paths[endpoint], content=chunks(), headers={"Content-Type": "application/json"})
    assert_error(response, 413, "SERGE_MAX_REQUEST_BYTES")


NUMBERS = {
    "NaN duration": ('{"chat": {}, "messages": [{"id": "a", "role": "user", "content": "x", "ttft_s": NaN}]}',
                     "NaN"),
    "infinite duration": ('{"chat": {}, "messages": [{"id": "a", "role": "user", "content": "x", '
                          '"duration_s": 1e999}]}', "finite"),
    "token count past 64 bits": ('{"chat": {}, "messages": [{"id": "a", "role": "user", "content": "x", '
                                 '"prompt_tokens": 100000000000000000000000}]}', "64 bits"),
}


@pytest.mark.parametrize("case", list(NUMBERS))
def test_numbers_json_cannot_hold_or_the_database_cannot_store_are_refused(http, paths, case):
    body, words = NUMBERS[case]
    assert_error(send(http, "POST", paths["import"], body.encode()), 400, words)


def test_deep_nesting_is_a_400(http, paths):
    assert_error(send(http, "POST", paths["create"], b'{"settings": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"),
                 400, "send application/json")


@pytest.mark.parametrize("value", ["5", "false", '{"a": 1}', '[1, 2]', '"x"'])
def test_a_stop_setting_of_the_wrong_kind_is_a_400(http, paths, value):
    # found by tests/test_sampling_properties.py: `tuple(5)` raised a TypeError, which was a 500
    response = send(http, "POST", paths["create"], b'{"settings": {"stop": %s}}' % value.encode())
    if value == '"x"':
        assert response.status_code == 201, response.text
    else:
        assert_error(response, 400, "stop", "settings.stop")
