"""The request log: one logfmt line per request, with who, what model, tokens and timings; never what was said
or a secret."""

from __future__ import annotations

import logging
import re

import httpx
import pytest
from standin import NAME as MODEL, stand_in
from conftest import ServerThread, held_port
from test_chats_api import read_events

from serge.accounts import Accounts
from serge.settings import Settings
from serge.store import AccountStore, Database
from serge.web.app import build_app


# On the stand-in model (standin.py): nothing here needs the real one.
settings, engine = stand_in("settings", "engine")


SECRET = "my-bank-pin-is-8531"
PASSWORD = "correct horse battery staple"
FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


@pytest.fixture(scope="module")
def signed_in(settings, engine, tmp_path_factory):
    """A server with one account; (client with a key, the key, the key's id)."""
    own = Settings(data_dir=tmp_path_factory.mktemp("request-log"), models_dir=settings.models_dir,
                   torch_threads=settings.torch_threads)
    database = Database(own.database)
    database.migrate()
    accounts = Accounts(AccountStore(database))
    alice = accounts.add_user("alice", PASSWORD)
    record, key = accounts.create_key(alice, "laptop")
    database.close()
    with ServerThread(build_app(own, engine), held_port()) as server, \
            httpx.Client(base_url=server.url, timeout=120, headers={"Authorization": f"Bearer {key}"}) as http:
        yield http, key, record.id


def lines(caplog) -> list[dict[str, str]]:
    return [dict((k, v.strip('"')) for k, v in FIELD.findall(r.getMessage()))
            for r in caplog.records if r.name == "serge.requests"]


def test_each_request_logs_one_line_with_who_what_and_how_long_but_never_the_text_or_the_key(signed_in, caplog):
    client, key, key_id = signed_in
    caplog.set_level(logging.INFO, logger="serge.requests")
    chat = client.post("/api/chats", json={"settings": {"max_new_tokens": 6, "temperature": 0}}).json()["id"]
    with client.stream("POST", f"/api/chats/{chat}/messages", json={"content": f"Remember {SECRET}."}) as reply:
        chat_request_id = reply.headers["x-request-id"]
        done = [d for kind, d in read_events(reply) if kind == "done"][0]["message"]
    completion = client.post("/v1/chat/completions?api_key=" + SECRET, json={
        "model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": f"Say {SECRET}"}]})
    assert completion.status_code == 200, completion.text
    refused = httpx.post(f"{client.base_url}/v1/chat/completions", json={"model": MODEL, "messages": []},
                         headers={"Authorization": "Bearer sk-serge-not-a-real-key", "X-Request-ID": "proxy-7"})

    logged = lines(caplog)
    assert [(x["method"], x["path"], x["status"]) for x in logged] == [
        ("POST", "/api/chats", "201"),
        ("POST", f"/api/chats/{chat}/messages", "200"),
        ("POST", "/v1/chat/completions", "200"),
        ("POST", "/v1/chat/completions", "401"),
    ], "one line per request, the query string left out"
    created, chat_line, v1_line, refused_line = logged
    assert chat_line["id"] == chat_request_id and refused_line["id"] == refused.headers["x-request-id"] == "proxy-7"
    assert len({x["id"] for x in logged}) == 4
    for line in (created, chat_line, v1_line):
        assert line["user"] == "alice" and line["key"] == key_id
    assert refused_line["user"] == "-" and "key" not in refused_line
    assert "model" not in created and "prompt_tokens" not in created

    usage = completion.json()["usage"]
    assert v1_line["model"] == MODEL
    assert int(v1_line["prompt_tokens"]) == usage["prompt_tokens"]
    assert int(v1_line["completion_tokens"]) == usage["completion_tokens"]
    assert chat_line["model"] == MODEL and int(chat_line["completion_tokens"]) == done["completion_tokens"]
    for line in (chat_line, v1_line):
        assert 0 < float(line["ttft_s"]) <= float(line["gen_s"]) <= float(line["total_s"])

    text = "\n".join(r.getMessage() for r in caplog.records)
    assert SECRET not in text and key not in text and key[len("sk-serge-"):][:12] not in text
    assert PASSWORD not in text
