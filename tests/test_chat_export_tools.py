"""A chat's tools travel with it: the JSON export carries the servers it ticks, its tool choice and the tools
"always allowed" in it, and an import reads them back (keeping the servers the importer may use); Serge's
own /mcp reads a chat with the tools its replies called, and a search that hits a chat's title says so in
`match`. On the stand-in model, a real server, the official `mcp` client."""

from __future__ import annotations

from contextlib import closing

import pytest

from conftest import own_server
from standin import stand_in
from test_accounts_api import add_user, login, serge
from test_mcp_server import call, structured

settings, engine = stand_in("settings", "engine")

CALL = {"id": "call-1", "server": "serge", "tool": "search_knowledge", "arguments": '{"query": "ferry to Skerry"}',
        "state": "done", "result": "The ferry to Skerry leaves at nine.", "is_error": False, "cut": False}
EXPORTED = {"format": "serge.chat", "version": 1,
            "chat": {"title": "Harbour questions", "tools": ["serge", "not-here"], "tool_choice": "first",
                     "tool_approvals": ["serge/search_knowledge", "not-here/write_note"]},
            "messages": [{"id": "q", "role": "user", "content": "When does the ferry leave?"},
                         {"id": "a", "parent_id": "q", "role": "assistant", "content": "At nine.",
                          "tool_calls": [CALL]}]}


@pytest.fixture(scope="module")
def site(settings, engine, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("export-tools")
    with own_server(settings, engine, data_dir) as url:
        add_user(data_dir, "alice")
        with closing(login(url, "alice")) as alice:
            yield {"url": url, "http": alice, "key": serge(data_dir, "keys", "create", "alice").strip()}


def test_the_json_export_carries_the_chats_tools_choice_and_approvals_and_import_reads_them_back(site):
    http = site["http"]
    imported = http.post("/api/chats/import", json=EXPORTED)
    assert imported.status_code == 201, imported.text
    chat = imported.json()
    # the server this one has no such server for is left out, and so are its approvals
    assert (chat["tools"], chat["tool_choice"], chat["tool_approvals"]) == (["serge"], "first",
                                                                            ["serge/search_knowledge"])
    exported = http.get(f"/api/chats/{chat['id']}/export?format=json").json()["chat"]
    assert (exported["tools"], exported["tool_choice"], exported["tool_approvals"]) == \
        (["serge"], "first", ["serge/search_knowledge"])
    again = http.post("/api/chats/import", json={**EXPORTED, "chat": exported}).json()
    assert (again["tools"], again["tool_choice"], again["tool_approvals"]) == \
        (chat["tools"], chat["tool_choice"], chat["tool_approvals"])


def test_an_export_without_tools_still_imports_as_a_chat_without_tools(site):
    old = {**EXPORTED, "chat": {"title": "Before tools"}}
    chat = site["http"].post("/api/chats/import", json=old).json()
    assert (chat["tools"], chat["tool_choice"], chat["tool_approvals"]) == ([], "auto", [])


def test_mcp_read_chat_gives_the_tool_calls_of_each_reply(site):
    chat = site["http"].post("/api/chats/import", json=EXPORTED).json()
    read = structured(call(site, site["key"], "read_chat", {"id": chat["id"]}))
    question, answer = read["messages"]
    assert question["tool_calls"] == []
    assert answer["tool_calls"] == [{k: CALL[k] for k in ("server", "tool", "arguments", "state", "result")}]


def test_mcp_search_chats_says_where_a_title_holds_the_words(site):
    site["http"].post("/api/chats/import", json={**EXPORTED, "chat": {"title": "Lighthouse keeper rota"}})
    [found] = structured(call(site, site["key"], "search_chats", {"query": "keeper"}))
    assert found["title"] == "Lighthouse keeper rota" and found["match"] == "Lighthouse keeper rota"
