"""Serge's `/mcp` through the official `mcp` SDK's client, on a real server with two accounts: the tools are
listed, a search of alice's collection returns her passage with file and page, her chats are found and read,
and bob's key reaches none of hers; a request without a key, or with a bad one, is a 401; bad input is a tool
error or a 4xx, never a 500."""

from __future__ import annotations

import asyncio
import json
from contextlib import closing

import httpx
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

import documents as files
from conftest import own_server
from test_accounts_api import add_user, login, serge
from test_chat_documents import QUESTION, documents_engine, recorder  # noqa: F401
from test_chats_api import send
from test_knowledge import indexed, make, put

TOOLS = {"list_collections", "search_knowledge", "search_chats", "read_chat"}


@pytest.fixture(scope="module")
def site(standin_settings, recorder, tmp_path_factory):
    """A server where alice has a collection (the twelve-page report) and a chat, and bob has neither."""
    data_dir = tmp_path_factory.mktemp("mcp-data")
    with documents_engine(standin_settings, recorder) as (settings, engine), \
            own_server(settings, engine, data_dir) as url:
        add_user(data_dir, "alice")
        add_user(data_dir, "bob")
        with closing(login(url, "alice")) as alice:
            harbour = make(alice, "harbour")
            assert put(alice, harbour["id"], "minutes.pdf", files.long_report_pdf()).status_code == 201
            indexed(alice, harbour["id"])
            chat = alice.post("/api/chats", json={"title": "Ferry times", "settings": {"max_new_tokens": 4}}).json()
            send(alice, f"/api/chats/{chat['id']}/messages", {"content": "The ferry to Skerry leaves at nine."})
        yield {"url": url, "chat": chat["id"], "collection": harbour["id"],
               "alice": serge(data_dir, "keys", "create", "alice", "--name", "agent").strip(),
               "bob": serge(data_dir, "keys", "create", "bob", "--name", "agent").strip()}


def session_of(site, key: str | None, steps):
    """Run `steps(session)` in an MCP client session to the site's /mcp, sending `key` as a bearer token."""

    async def run():
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with httpx2.AsyncClient(headers=headers, timeout=120) as http, \
                streamable_http_client(f"{site['url']}/mcp", http_client=http) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            return await steps(session)

    return asyncio.run(run())


def structured(result) -> object:
    assert not result.is_error, result.content
    found = result.structured_content
    return found["result"] if set(found) == {"result"} else found


def call(site, key: str, tool: str, arguments: dict):
    async def steps(session):
        return await session.call_tool(tool, arguments)

    return session_of(site, key, steps)


def test_the_tools_are_listed_each_read_only(site):
    async def steps(session):
        return (await session.list_tools()).tools

    tools = session_of(site, site["alice"], steps)
    assert {t.name for t in tools} == TOOLS
    assert all(t.annotations.read_only_hint for t in tools)
    search = next(t for t in tools if t.name == "search_knowledge")
    assert set(search.input_schema["required"]) == {"collection", "query"}


def test_a_search_returns_alices_passage_with_file_and_page(site):
    [collection] = structured(call(site, site["alice"], "list_collections", {}))
    assert (collection["name"], collection["id"], collection["files_indexed"]) == ("harbour", site["collection"], 1)
    passages = structured(call(site, site["alice"], "search_knowledge",
                               {"collection": "harbour", "query": QUESTION, "limit": 3}))
    assert len(passages) == 3
    top = passages[0]
    assert (top["collection"], top["file"], top["page"]) == ("harbour", "minutes.pdf", 3)
    assert "Ottoline Vance" in " ".join(top["passage"].split())
    by_id = structured(call(site, site["alice"], "search_knowledge",
                            {"collection": site["collection"], "query": QUESTION, "limit": 1}))
    assert by_id == passages[:1]


def test_alices_chats_are_found_and_read(site):
    [found] = structured(call(site, site["alice"], "search_chats", {"query": "skerry"}))
    assert found["id"] == site["chat"] and found["title"] == "Ferry times" and "Skerry" in found["match"]
    chat = structured(call(site, site["alice"], "read_chat", {"id": site["chat"]}))
    assert chat["title"] == "Ferry times" and not chat["truncated"]
    assert [m["role"] for m in chat["messages"]] == ["user", "assistant"]
    assert chat["messages"][0]["content"] == "The ferry to Skerry leaves at nine."


def test_bobs_key_reaches_none_of_alices_collections_or_chats(site):
    assert structured(call(site, site["bob"], "list_collections", {})) == []
    for name in ("harbour", site["collection"]):
        refused = call(site, site["bob"], "search_knowledge", {"collection": name, "query": QUESTION})
        assert refused.is_error and "no collection" in refused.content[0].text
        assert "Ottoline" not in json.dumps(refused.model_dump())
    assert structured(call(site, site["bob"], "search_chats", {"query": "skerry"})) == []
    unread = call(site, site["bob"], "read_chat", {"id": site["chat"]})
    assert unread.is_error and "no chat" in unread.content[0].text and "ferry" not in unread.content[0].text.lower()


def test_bad_arguments_are_tool_errors_naming_what_to_fix(site):
    empty = call(site, site["alice"], "search_knowledge", {"collection": "harbour", "query": "  "})
    assert empty.is_error and "empty" in empty.content[0].text
    many = call(site, site["alice"], "search_knowledge", {"collection": "harbour", "query": "x", "limit": 500})
    assert many.is_error and "limit" in many.content[0].text
    long = call(site, site["alice"], "search_chats", {"query": "x" * 5000})
    assert long.is_error and "2000" in long.content[0].text
    wrong_type = call(site, site["alice"], "read_chat", {"id": ["not", "a", "string"]})
    assert wrong_type.is_error


def test_without_a_valid_key_mcp_is_a_401_and_never_a_500(site):
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                  "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                             "clientInfo": {"name": "t", "version": "1"}}}
    accept = {"Accept": "application/json, text/event-stream"}
    for headers in ({}, {"Authorization": "Bearer sk-serge-forged"}):
        refused = httpx.post(f"{site['url']}/mcp", json=initialize, headers={**accept, **headers})
        assert refused.status_code == 401, refused.text
    with pytest.raises(Exception):  # the SDK's client fails to connect rather than hanging
        session_of(site, "sk-serge-forged", lambda session: session.list_tools())
    key = {**accept, "Authorization": f"Bearer {site['alice']}"}
    ok = httpx.post(f"{site['url']}/mcp", json=initialize, headers=key)
    assert ok.status_code == 200 and ok.json()["result"]["serverInfo"]["name"] == "serge"
    for body, content_type in ((b"{not json", "application/json"), (b"[]", "application/json"),
                               (b'{"jsonrpc": "2.0"}', "application/json"), (b"hello", "text/plain")):
        bad = httpx.post(f"{site['url']}/mcp", content=body, headers={**key, "Content-Type": content_type})
        assert 400 <= bad.status_code < 500, (body, bad.status_code, bad.text)
    for method in ("GET", "DELETE", "PUT"):  # no session, no stream of its own: only POST is answered
        other = httpx.request(method, f"{site['url']}/mcp", headers=key)
        assert 400 <= other.status_code < 500, (method, other.status_code, other.text)
    big = httpx.post(f"{site['url']}/mcp", content=b'{"a": "' + b"x" * 20_000_000 + b'"}',
                     headers={**key, "Content-Type": "application/json"})
    assert big.status_code == 413
    other_site = httpx.post(f"{site['url']}/mcp", json=initialize,
                            headers={**key, "Origin": "https://evil.example"})
    assert other_site.status_code == 403


def test_while_serge_has_no_accounts_this_machine_needs_no_key(standin_settings, standin_engine, tmp_path_factory):
    async def steps(session):
        return await session.call_tool("list_collections", {})

    with own_server(standin_settings, standin_engine, tmp_path_factory.mktemp("mcp-local")) as url, \
            httpx.Client(base_url=url, timeout=60) as local:
        assert local.post("/api/knowledge", json={"name": "notes"}).status_code == 201
        [mine] = structured(session_of({"url": url}, None, steps))
    assert mine["name"] == "notes"
