"""Tools in chats, over the chat API on a real server (the stand-in model, steered to call), with real MCP servers
over stdio (tests/mcp_servers.py, and mcp-server-time from PyPI): each call shown, run, stored and fed back."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import free_port, own_server
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
