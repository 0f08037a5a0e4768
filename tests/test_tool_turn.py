"""One tool turn for the page and `/v1/responses`: the promises that broke where the two loops disagreed. On a real
server (the stand-in model, steered to call), with real MCP servers over stdio (tests/mcp_harbour.py,
tests/mcp_servers.py) and a real HTTP server that fails, and the usage ledger read from the real SQLite file."""

from __future__ import annotations

import http.server
import json
import logging
import threading
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from conftest import own_server
from standin import NAME as MODEL, stand_in
from test_accounts_api import add_user, login, serge
from test_chat_tools import script
from test_chats_api import read_events
from test_responses_mcp import ASK, HARBOUR, forced, harbour, register

from serge.store import Database, UsageFilter
from serge.store.tools import ToolServerStore
from serge.store.usage.ledger import UsageStore

settings, engine = stand_in("settings", "engine")

PASSWORD, TOKEN = "hunter2pass", "tok3nsecret"


def ledger(data_dir: Path) -> int:
    """Every token the usage ledger holds: prompt plus generated, all users."""
    database = Database(f"sqlite:///{data_dir / 'serge.db'}")
    try:
        return sum(t.prompt_tokens + t.completion_tokens for t in UsageStore(database).totals("user", UsageFilter()))
    finally:
        database.close()


@pytest.fixture(scope="module")
def site(settings, engine, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("tool-turn")
    register(settings, data_dir, harbour=(HARBOUR, False))
    database = Database(f"sqlite:///{data_dir / 'serge.db'}")
    ToolServerStore(database).add("notes", command=script("notes", "write_note"),
                                  env={"NOTES_FILE": str(data_dir / "notes.txt")})
    ToolServerStore(database).add("echo", command=script("echo", "echo"))
    database.close()
    with own_server(settings, engine, data_dir) as url:
        yield url, data_dir


@pytest.fixture(scope="module")
def client(site) -> OpenAI:
    return OpenAI(base_url=f"{site[0]}/v1", api_key="unused", max_retries=0, timeout=120)


def test_every_pass_of_a_responses_tool_turn_is_metered(client, site):
    before = ledger(site[1])
    response = client.responses.create(model=MODEL, input=ASK, tools=[harbour(require_approval="never")],
                                       tool_choice=forced(), max_output_tokens=120)
    assert [i.type for i in response.output][:2] == ["mcp_list_tools", "mcp_call"]
    told = response.usage.input_tokens + response.usage.output_tokens
    assert ledger(site[1]) - before == told


def test_every_pass_of_a_page_tool_reply_is_metered(site):
    url, data_dir = site
    long_ask = ASK + " " + "tell me of the tides and the harbour " * 40  # ~1,500 bytes: a token each
    with httpx.Client(base_url=url, timeout=120) as page:
        chat = page.post("/api/chats", json={"tools": ["echo"], "tool_choice": "first",
                                             "settings": {"max_new_tokens": 120, "temperature": 0}}).json()["id"]
        before = ledger(data_dir)
        with page.stream("POST", f"/api/chats/{chat}/messages", json={"content": long_ask}) as response:
            done = [data for kind, data in read_events(response) if kind == "done"][0]["message"]
    [call] = done["tool_calls"]
    assert call["state"] == "done" and call["result"].startswith("echo: ")
    spent = ledger(data_dir) - before
    assert spent == done["prompt_tokens"] + done["completion_tokens"]
    # two passes, each reading the question, the second the call's result too
    assert done["prompt_tokens"] >= 2 * len(long_ask) + len(call["result"])


def test_a_replys_max_new_tokens_bounds_all_its_passes_together(site):
    url, _ = site
    with httpx.Client(base_url=url, timeout=120) as page:
        # a call at every step: each pass alone would fit in 100 tokens, eight of them would not
        chat = page.post("/api/chats", json={"tools": ["echo"], "tool_choice": "always",
                                             "settings": {"max_new_tokens": 100, "temperature": 0}}).json()["id"]
        with page.stream("POST", f"/api/chats/{chat}/messages", json={"content": "Say it back"}) as response:
            done = [data for kind, data in read_events(response) if kind == "done"][0]["message"]
    assert done["tool_calls"] and done["tool_calls"][0]["state"] == "done", "the call ran"
    assert done["completion_tokens"] <= 100, "the limit is the reply's, not each pass's"
    assert done["status"] == "length"


def test_an_approval_sent_twice_on_the_same_response_runs_the_call_once(client, site):
    notes = site[1] / "notes.txt"
    first = client.responses.create(model=MODEL, input="Write a note", max_output_tokens=120,
                                    tools=[{"type": "mcp", "server_label": "notes"}],
                                    tool_choice={"type": "mcp", "server_label": "notes", "name": "write_note"})
    asked = first.output[-1]
    assert asked.type == "mcp_approval_request"
    answer = [{"type": "mcp_approval_response", "approve": True, "approval_request_id": asked.id}]
    runs = []
    for _ in range(2):  # the openai client retries a request by default
        before = notes.read_text().count("\n") if notes.exists() else 0
        r = httpx.post(f"{site[0]}/v1/responses", timeout=120, json={
            "model": MODEL, "previous_response_id": first.id, "max_output_tokens": 120,
            "tools": [{"type": "mcp", "server_label": "notes"}], "input": answer})
        runs.append((r.status_code, (notes.read_text().count("\n") if notes.exists() else 0) - before))
    assert runs[0] == (200, 1)
    assert runs[1][1] == 0, "the second answer ran nothing"
    assert runs[1][0] == 409, runs


def test_the_sdks_stream_helper_completes_a_turn_with_an_mcp_tool(client):
    with client.responses.stream(model=MODEL, input=ASK, tools=[harbour(require_approval="never")],
                                 tool_choice=forced(), max_output_tokens=120) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert [i.type for i in final.output][:2] == ["mcp_list_tools", "mcp_call"]


def test_a_presets_name_works_with_the_mcp_tool(client, site):
    made = httpx.post(f"{site[0]}/api/presets", timeout=60, json={
        "name": "harbourmaster", "model": MODEL, "system_prompt": "You keep the harbour."})
    assert made.status_code == 201, made.text
    response = client.responses.create(model="harbourmaster", input=ASK, max_output_tokens=120,
                                       tools=[harbour(require_approval="never")], tool_choice=forced())
    assert response.model == "harbourmaster" and response.output[1].type == "mcp_call"


@pytest.mark.real_model
def test_the_real_model_asking_the_same_call_again_runs_it_once_and_answers(real_settings, engines,
                                                                            tmp_path_factory):
    from conftest import MODEL as REAL
    from test_responses_mcp import CLOCK

    data_dir = tmp_path_factory.mktemp("tool-turn-repeat")
    register(real_settings, data_dir, clock=(CLOCK, False))
    with own_server(real_settings, engines("auto"), data_dir) as url:
        response = OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=300).responses.create(
            model=REAL, input="What time is it now in the Europe/Paris timezone?", temperature=0,
            tools=[{"type": "mcp", "server_label": "clock", "require_approval": "never"}],
            tool_choice=forced("get_current_time", "clock"), max_output_tokens=120)
    calls = [i for i in response.output if i.type == "mcp_call"]
    ran = [(i.name, json.dumps(json.loads(i.arguments), sort_keys=True)) for i in calls if i.status == "completed"]
    assert ran and len(ran) == len(set(ran)), ran
    for again in calls[len(ran):]:  # asked again: closed unrun, saying why
        assert again.status == "failed" and "not run again" in json.dumps(again.error.model_dump())
    # the answer is text: offered no tool, it cannot begin as a call (the 135M model may still quote one in prose)
    assert response.output[-1].type == "message" and not response.output_text.lstrip().startswith("{")


@pytest.mark.parametrize("listed", [{"tools": [{}]}, {"tools": [{"name": "tide", "annotations": "x"}]},
                                    {"tools": "x"}, {"tools": [{"name": 3}]}])
def test_a_forged_mcp_list_tools_item_is_a_400_naming_it(site, listed):
    r = httpx.post(f"{site[0]}/v1/responses", timeout=60, json={
        "model": MODEL, "tools": [harbour()],
        "input": [{"role": "user", "content": ASK},
                  {"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "harbour", **listed}]})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith("input"), r.text


class Failing(http.server.BaseHTTPRequestHandler):
    """An MCP server's URL that answers every request with a 500."""

    def do_POST(self):  # noqa: N802
        self.send_response(500)
        self.send_header("content-length", "0")
        self.end_headers()

    do_GET = do_POST  # noqa: N815

    def log_message(self, *args):
        pass


def test_a_tool_servers_url_secrets_never_reach_a_plain_user_an_export_or_the_log(settings, engine,
                                                                                  tmp_path_factory, caplog):
    failing = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=failing.serve_forever, daemon=True).start()
    data_dir = tmp_path_factory.mktemp("tool-secrets")
    add_user(data_dir, "alice", "--admin")
    add_user(data_dir, "bob")
    database = Database(f"sqlite:///{data_dir / 'serge.db'}")
    ToolServerStore(database).add(
        "web", url=f"http://user:{PASSWORD}@127.0.0.1:{failing.server_port}/mcp?token={TOKEN}")
    database.close()
    caplog.set_level(logging.DEBUG)
    for name in ("httpx", "httpcore", "mcp"):  # the MCP client logs the URL it connects to at debug
        caplog.set_level(logging.DEBUG, logger=name)
    try:
        with own_server(settings, engine, data_dir) as url:
            bob = login(url, "bob")
            seen = [bob.get("/api/tools").text]
            chat = bob.post("/api/chats", json={"tools": ["web"], "settings": {"max_new_tokens": 8}})
            assert chat.status_code == 201, chat.text
            chat_id = chat.json()["id"]
            with bob.stream("POST", f"/api/chats/{chat_id}/messages", json={"content": "hi"}) as response:
                seen += [json.dumps(data) for _, data in read_events(response)]
            seen += [bob.get(f"/api/chats/{chat_id}").text, bob.get(f"/api/chats/{chat_id}/export").text,
                     bob.get(f"/api/chats/{chat_id}/export?format=md").text]
            key = serge(data_dir, "keys", "create", "bob", "--name", "t").strip()
            seen.append(httpx.post(f"{url}/v1/responses", timeout=60, headers={"Authorization": f"Bearer {key}"},
                                   json={"model": MODEL, "input": "hi", "max_output_tokens": 4,
                                         "tools": [{"type": "mcp", "server_label": "web"}]}).text)
    finally:
        failing.shutdown()
    text = "\n".join(seen) + "\n" + caplog.text
    assert "web" in text and "could not be reached" in text, "the failure itself is told"
    assert PASSWORD not in text and TOKEN not in text
    assert f"user:***@127.0.0.1:{failing.server_port}/mcp" in caplog.text, "the log names the server, masked"
