"""The real model calls a real MCP server's tool: `serge mcp add clock -- python -m mcp_server_time`, a chat with
the clock ticked, and a reply that called it and then answered (the issue's "done when")."""

from __future__ import annotations

import httpx
import pytest
from conftest import own_server
from test_chat_tools import ask

from serge.cli.main import main as serge_main

pytestmark = pytest.mark.real_model


def test_the_real_model_calls_the_clock_and_answers_with_its_result(settings, engine, tmp_path):
    serge_main(["mcp", "add", "clock", "--data-dir", str(tmp_path), "--", "python", "-m", "mcp_server_time"])
    with own_server(settings, engine, tmp_path) as url, httpx.Client(base_url=url, timeout=300) as client:
        # a reply's max_new_tokens holds its call and its answer together
        chat = client.post("/api/chats", json={"tools": ["clock"], "tool_choice": "first",
                                                "settings": {"max_new_tokens": 160, "temperature": 0}}).json()["id"]
        calls, reply = ask(client, chat, "What time is it in Europe/Paris?")
    finished = [c for c in calls if c["state"] != "running"]
    assert finished and finished[0]["server"] == "clock"
    assert finished[0]["tool"] in ("get_current_time", "convert_time")
    assert reply["status"] in ("complete", "length") and reply["content"]
    assert reply["tool_calls"] == finished
    asked = [(c["tool"], c["arguments"]) for c in finished]
    assert len(asked) == len(set(asked)), "a call the model made already is not run again: it answers instead"
