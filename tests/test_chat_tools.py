"""Tools in chats, over the chat API on a real server (the stand-in model, steered to call), with real MCP servers
over stdio (tests/mcp_servers.py, and mcp-server-time from PyPI): each call shown, run, stored and fed back."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import own_server
from standin import stand_in
from test_chats_api import read_events

from mcp_servers import BIG, CONTROL

settings, engine = stand_in("settings", "engine")

HERE = Path(__file__).parent
SHORT = {"max_new_tokens": 120, "temperature": 0}


def script(name: str, *tools: str) -> list[str]:
    """The argv of a stdio server from tests/mcp_servers.py offering only `tools`."""
    return [sys.executable, str(HERE / "mcp_servers.py"), name, *tools]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("chat-tools")


@pytest.fixture(scope="module")
def server(settings, engine, folder):
    from serge.store import Database, ToolServerStore
    from serge.tools import ToolServers

    db = Database(f"sqlite:///{folder / 'serge.db'}")
    db.migrate()
    registry = ToolServers(ToolServerStore(db))
    for name, argv in {"echo": script("echo", "echo"), "hang": script("hang", "hang"),
                       "crash": script("crash", "crash"), "flood": script("flood", "flood"),
                       "control": script("control", "control"), "notes": script("notes", "write_note"),
                       "clock": ["python", "-m", "mcp_server_time"]}.items():
        registry.register(name, command=argv, env={"NOTES_FILE": str(folder / "notes.txt")})
    db.close()
    with own_server(settings, engine, folder, tool_timeout_s=8.0, tool_output_chars=2000) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server, timeout=120) as c:
        yield c


def chat_with(client, tools: list[str], choice: str = "first", **more) -> str:
    r = client.post("/api/chats", json={"tools": tools, "tool_choice": choice, "settings": SHORT, **more})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def ask(client, chat_id: str, content: str = "use the tool", on_tool=None) -> tuple[list[dict], dict]:
    """Send a message; every tool event's call, in order, and the saved reply. `on_tool(call)` runs at each."""
    calls, done = [], None
    with client.stream("POST", f"/api/chats/{chat_id}/messages", json={"content": content}) as response:
        assert response.status_code == 200, response.read()
        for kind, data in read_events(response):
            if kind == "tool":
                calls.append(data["call"])
                if on_tool:
                    on_tool(data["call"])
            elif kind == "done":
                done = data["message"]
    assert done is not None
    return calls, done


def test_a_ticked_servers_tool_is_called_shown_as_it_happens_and_kept_with_the_reply(client):
    chat = chat_with(client, ["echo"])
    calls, reply = ask(client, chat)
    assert [c["state"] for c in calls] == ["running", "done"], reply
    assert calls[0]["server"] == "echo" and calls[0]["tool"] == "echo"
    assert calls[-1]["result"].startswith("echo: ")
    assert reply["status"] == "complete" and reply["tool_calls"] == [calls[-1]]
    stored = client.get(f"/api/chats/{chat}").json()["messages"][-1]
    assert stored["tool_calls"] == [calls[-1]]  # a reload shows it again


def test_a_tool_that_hangs_times_out_and_the_reply_goes_on_saying_so(client):
    started = time.monotonic()
    calls, reply = ask(client, chat_with(client, ["hang"]))
    assert 7 < time.monotonic() - started < 60
    assert calls[-1]["is_error"] and "did not answer within 8 s" in calls[-1]["result"]
    assert reply["status"] == "complete"


def test_a_tool_that_crashes_fails_with_a_message_and_its_server_is_started_again(client):
    chat = chat_with(client, ["crash"])
    for _ in range(2):  # the second call reaches a server started again
        calls, reply = ask(client, chat)
        assert calls[-1]["is_error"] and "closed the connection" in calls[-1]["result"], calls
        assert reply["status"] == "complete"


def test_five_megabytes_of_output_are_cut_and_the_model_is_told(client):
    calls, reply = ask(client, chat_with(client, ["flood"]))
    result = calls[-1]
    assert result["cut"] and not result["is_error"]
    assert len(result["result"]) < 2200 and f"of {BIG} characters are shown" in result["result"]
    assert reply["status"] == "complete"


def test_control_strings_in_a_tools_output_stay_text(client):
    calls, reply = ask(client, chat_with(client, ["control"]))
    assert calls[-1]["result"] == CONTROL  # kept as written: the engine tokenizes it as text (test_tool_text)
    assert reply["status"] == "complete"


def test_a_tool_that_writes_waits_for_allow_and_deny_tells_the_model(client, folder):
    notes = folder / "notes.txt"
    chat = chat_with(client, ["notes"])

    def deny(call):
        if call["state"] == "waiting":
            assert not notes.exists()  # it waits: nothing ran yet
            r = client.post(f"/api/chats/{chat}/tool-calls/{call['id']}", json={"allow": False})
            assert r.status_code == 200, r.text
    calls, reply = ask(client, chat, on_tool=deny)
    assert [c["state"] for c in calls] == ["waiting", "denied"]
    assert "denied" in calls[-1]["result"] and not notes.exists()
    assert reply["status"] == "complete"

    def allow_always(call):
        if call["state"] == "waiting":
            client.post(f"/api/chats/{chat}/tool-calls/{call['id']}", json={"allow": True, "always": True})
    calls, _ = ask(client, chat, on_tool=allow_always)
    assert [c["state"] for c in calls] == ["waiting", "running", "done"]
    assert notes.read_text().count("\n") == 1
    assert client.get(f"/api/chats/{chat}").json()["tool_approvals"] == ["notes/write_note"]
    calls, _ = ask(client, chat)  # always allowed in this chat: it runs without asking
    assert [c["state"] for c in calls] == ["running", "done"]
    assert notes.read_text().count("\n") == 2


def test_a_decision_for_no_waiting_call_is_a_409(client):
    chat = chat_with(client, ["echo"])
    r = client.post(f"/api/chats/{chat}/tool-calls/nope", json={"allow": True})
    assert r.status_code == 409 and "no call of that id waits" in r.json()["error"]["message"]


def test_nine_calls_asked_for_stop_at_eight_and_the_model_then_answers(client):
    # a reply's max_new_tokens bounds all its passes together: room for nine calls and an answer
    calls, reply = ask(client, chat_with(client, ["echo"], choice="always",
                                         settings={"max_new_tokens": 4000, "temperature": 0}))
    finished = [c for c in calls if c["state"] != "running"]
    assert len(finished) == 8 and all(c["state"] == "done" for c in finished)
    assert reply["status"] == "complete" and reply["content"]
    assert len(reply["tool_calls"]) == 8


def test_a_stop_during_a_call_stops_the_call(client):
    chat = chat_with(client, ["hang"])
    started = time.monotonic()

    def stop(call):
        if call["state"] == "running":
            assert client.post(f"/api/chats/{chat}/stop").status_code == 200
    calls, reply = ask(client, chat, on_tool=stop)
    assert time.monotonic() - started < 7  # before the 8 s timeout
    assert calls[-1]["state"] == "stopped" and reply["status"] == "stopped"


def test_a_stop_while_a_call_waits_for_approval_ends_the_reply_and_nothing_runs(client, folder):
    notes = folder / "notes.txt"
    before = notes.read_text() if notes.exists() else ""
    chat = chat_with(client, ["notes"])

    def stop(call):
        if call["state"] == "waiting":
            assert client.post(f"/api/chats/{chat}/stop").status_code == 200
    calls, reply = ask(client, chat, on_tool=stop)
    assert [c["state"] for c in calls] == ["waiting", "stopped"] and reply["status"] == "stopped"
    assert (notes.read_text() if notes.exists() else "") == before


def test_calls_and_results_are_exported_and_imported(client):
    chat = chat_with(client, ["echo"])
    _, reply = ask(client, chat)
    exported = client.get(f"/api/chats/{chat}/export").json()
    assert exported["messages"][-1]["tool_calls"] == reply["tool_calls"]
    imported = client.post("/api/chats/import", json=exported)
    assert imported.status_code == 201, imported.text
    again = client.get(f"/api/chats/{imported.json()['id']}").json()
    assert again["messages"][-1]["tool_calls"] == reply["tool_calls"]
    markdown = client.get(f"/api/chats/{chat}/export", params={"format": "md"}).text
    assert "Called echo/echo" in markdown


def test_a_server_not_registered_cannot_be_named_and_no_request_gives_a_command(client):
    r = client.post("/api/chats", json={"tools": ["python -m http.server"]})
    assert r.status_code == 400 and "no tool server named" in r.json()["error"]["message"]
    r = client.post("/api/mcp/servers", json={"name": "evil", "url": "http://127.0.0.1:1/mcp", "check": False,
                                               "command": ["sh", "-c", "touch /tmp/owned"]})
    assert r.status_code == 400 and "command" in r.json()["error"]["message"]
    chat = chat_with(client, ["echo"])
    r = client.patch(f"/api/chats/{chat}", json={"tools": ["echo", "nope"]})
    assert r.status_code == 400
    assert client.get(f"/api/chats/{chat}").json()["tools"] == ["echo"]


def test_the_tools_a_user_may_tick_are_listed_with_their_tools(client):
    listed = {s["name"]: s for s in client.get("/api/tools").json()["servers"]}
    assert listed["serge"]["tools"][0]["name"] == "search_knowledge"
    assert [t["name"] for t in listed["clock"]["tools"]] == ["get_current_time", "convert_time"]
    assert listed["notes"]["tools"][0]["read_only"] is False


def test_the_stdio_servers_serge_started_stop_with_it(settings, engine, tmp_path):
    from serge.store import Database, ToolServerStore
    from serge.tools import ToolServers

    db = Database(f"sqlite:///{tmp_path / 'serge.db'}")
    db.migrate()
    ToolServers(ToolServerStore(db)).register("pid", command=script("pid", "pid"))
    db.close()
    with own_server(settings, engine, tmp_path) as url, httpx.Client(base_url=url, timeout=120) as c:
        calls, _ = ask(c, chat_with(c, ["pid"]))
        pid = int(calls[-1]["result"])
        os.kill(pid, 0)  # running
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    pytest.fail(f"the MCP server (pid {pid}) outlived Serge")


def test_search_knowledge_is_a_tool_over_the_chats_files(client):
    chat = chat_with(client, ["serge"])
    uploaded = client.post(f"/api/chats/{chat}/files",
                           files={"file": ("facts.txt", b"The lighthouse keeper is called Ottoline.\n", "text/plain")})
    assert uploaded.status_code == 201, uploaded.text
    calls, done = [], None
    with client.stream("POST", f"/api/chats/{chat}/messages",
                       json={"content": "Who keeps the lighthouse?", "attachments": [uploaded.json()["id"]]}) as r:
        assert r.status_code == 200, r.read()
        for kind, data in read_events(r):
            if kind == "tool":
                calls.append(data["call"])
            elif kind == "done":
                done = data["message"]
    assert calls[-1]["server"] == "serge" and calls[-1]["tool"] == "search_knowledge"
    assert calls[-1]["state"] == "done" and calls[-1]["result"], calls
    assert done["status"] == "complete"


def test_a_presets_servers_are_offered_in_a_chat_on_it_that_ticks_none(client):
    from standin import NAME

    made = client.post("/api/presets", json={"name": "echo-bot", "model": NAME, "tools": ["echo"]})
    assert made.status_code == 201, made.text
    calls, reply = ask(client, chat_with(client, [], model="echo-bot"))
    assert calls and calls[-1]["server"] == "echo" and calls[-1]["result"].startswith("echo: "), reply
