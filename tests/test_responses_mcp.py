"""The Responses API's `mcp` tool on a real server, through the official `openai` client, with real MCP servers
over stdio: `mcp-server-time` from PyPI and a small server written with the `mcp` SDK (tests/mcp_harbour.py).
A request names a registered server by its label; Serge lists its tools (`mcp_list_tools`), runs the calls the
model makes (`mcp_call` with `output` or `error`), asks before a call that needs approval
(`mcp_approval_request`, answered by an `mcp_approval_response`), and streams OpenAI's `response.mcp_*` events.
A `server_url` that is not the registered one, headers, an unknown server or one the user may not use are
refused. The stand-in model is steered to call with tool_choice {type: mcp}."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from conftest import own_server
from standin import NAME as MODEL, stand_in, standin_model
from test_accounts_api import add_user, serge
from test_chat_documents import Recording

from serge.engine import Engine
from serge.settings import Settings
from serge.store import Database
from serge.store.tools import ToolServerStore
from serge.web.responses.items import DENIED

settings, engine = stand_in("settings", "engine")

HARBOUR = [sys.executable, str(Path(__file__).parent / "mcp_harbour.py")]
CLOCK = [sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"]
BROKEN = [sys.executable, "-c", "raise SystemExit('no tools today')"]
ASK = "When is high water at Skerry?"


def register(settings, data_dir: Path, **servers) -> None:
    """Register MCP servers as an admin would (`serge mcp add`), in the database of `data_dir`."""
    own = settings.model_copy(update={"data_dir": data_dir})
    database = Database(own.database, own.database_busy_timeout_s)
    try:
        database.migrate()
        store = ToolServerStore(database)
        for name, (command, admins_only) in servers.items():
            store.add(name, command=command, admins_only=admins_only)
    finally:
        database.close()


@pytest.fixture(scope="module")
def server(settings, engine, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("responses-mcp")
    register(settings, data_dir, harbour=(HARBOUR, False), clock=(CLOCK, False), broken=(BROKEN, False))
    with own_server(settings, engine, data_dir) as url:
        yield url


@pytest.fixture(scope="module")
def client(server) -> OpenAI:
    return OpenAI(base_url=f"{server}/v1", api_key="not-needed", max_retries=0, timeout=120)


def harbour(**fields) -> dict:
    return {"type": "mcp", "server_label": "harbour", **fields}


def forced(name: str = "tide", label: str = "harbour") -> dict:
    return {"type": "mcp", "server_label": label, "name": name}


def test_a_forced_call_lists_the_tools_runs_the_call_and_the_model_goes_on(client):
    response = client.responses.create(model=MODEL, input=ASK, tools=[harbour(require_approval="never")],
                                       tool_choice=forced(), max_output_tokens=200)
    listed, call, *rest = response.output
    assert listed.type == "mcp_list_tools" and listed.server_label == "harbour" and listed.error is None
    assert {t.name for t in listed.tools} == {"tide", "ring_bell"}
    tide = next(t for t in listed.tools if t.name == "tide")
    assert tide.input_schema["required"] == ["place"]
    assert call.type == "mcp_call" and call.name == "tide" and call.server_label == "harbour"
    place = json.loads(call.arguments)["place"]
    assert call.output == f"High water at {place} is at noon." and call.error is None
    assert call.status == "completed" and rest, "the model went on after the call"
    assert response.usage.input_tokens > 0 and response.status in ("completed", "incomplete")
    assert client.responses.retrieve(response.id).output[1].output == call.output  # stored with its items


def test_a_pypi_server_is_called_and_its_error_comes_back_as_the_calls_error(client):
    response = client.responses.create(model=MODEL, input="What time is it in Paris?",
                                       tools=[{"type": "mcp", "server_label": "clock", "require_approval": "never"}],
                                       tool_choice=forced("get_current_time", "clock"), max_output_tokens=200)
    listed, call = response.output[:2]
    assert {t.name for t in listed.tools} == {"get_current_time", "convert_time"}
    assert call.type == "mcp_call" and call.name == "get_current_time"
    timezone = json.loads(call.arguments)["timezone"]
    if call.error is None:  # the stand-in's timezone happened to be a real one
        assert call.status == "completed" and timezone in call.output
    else:
        assert call.status == "failed" and call.output is None
        assert call.error.type == "mcp_tool_execution_error" and "timezone" in json.dumps(call.error.content).lower()


def test_a_call_that_needs_approval_waits_for_it_and_runs_once_approved(client):
    first = client.responses.create(model=MODEL, input=ASK, tools=[harbour()], tool_choice=forced(),
                                    max_output_tokens=200)
    assert [i.type for i in first.output] == ["mcp_list_tools", "mcp_approval_request"]
    asked = first.output[1]
    assert asked.name == "tide" and asked.server_label == "harbour" and "place" in json.loads(asked.arguments)
    second = client.responses.create(model=MODEL, previous_response_id=first.id, tools=[harbour()],
                                     input=[{"type": "mcp_approval_response", "approve": True,
                                             "approval_request_id": asked.id}], max_output_tokens=200)
    call = second.output[0]
    assert call.type == "mcp_call" and call.approval_request_id == asked.id and call.name == "tide"
    assert call.output == f"High water at {json.loads(asked.arguments)['place']} is at noon."
    assert "mcp_list_tools" not in [i.type for i in second.output], "listed once in a conversation"
    # answered again (a client retrying): the call is not run twice
    again = client.responses.create(model=MODEL, previous_response_id=second.id, tools=[harbour()],
                                     input=[{"type": "mcp_approval_response", "approve": True,
                                             "approval_request_id": asked.id}], max_output_tokens=200)
    assert "mcp_call" not in [i.type for i in again.output]


def test_a_denied_call_is_not_run_and_the_model_answers(client):
    first = client.responses.create(model=MODEL, input=ASK, tools=[harbour()], tool_choice=forced(),
                                    max_output_tokens=200)
    asked = first.output[1]
    denied = client.responses.create(model=MODEL, previous_response_id=first.id, tools=[harbour()],
                                     input=[{"type": "mcp_approval_response", "approve": False,
                                             "approval_request_id": asked.id}], max_output_tokens=200)
    assert [i.type for i in denied.output] == ["message"]


def test_a_client_that_keeps_its_own_state_echoes_the_items_with_store_false(client):
    first = client.responses.create(model=MODEL, input=ASK, tools=[harbour()], tool_choice=forced(),
                                    max_output_tokens=200, store=False)
    echoed = [i.model_dump(exclude_none=True) for i in first.output]
    second = client.responses.create(model=MODEL, tools=[harbour()], store=False, max_output_tokens=200, input=[
        {"role": "user", "content": ASK}, *echoed,
        {"type": "mcp_approval_response", "approve": True, "approval_request_id": first.output[1].id}])
    assert second.output[0].type == "mcp_call" and second.output[0].output.startswith("High water at")


def test_approval_filters_choose_which_calls_wait(client):
    never_tide = client.responses.create(model=MODEL, input=ASK, tool_choice=forced(), max_output_tokens=200, tools=[
        harbour(require_approval={"never": {"tool_names": ["tide"]}})])
    assert never_tide.output[1].type == "mcp_call"
    read_only = client.responses.create(model=MODEL, input=ASK, tool_choice=forced(), max_output_tokens=200, tools=[
        harbour(require_approval={"never": {"read_only": True}})])
    assert read_only.output[1].type == "mcp_call"
    bell = client.responses.create(model=MODEL, input="Ring the bell", tool_choice=forced("ring_bell"),
                                   max_output_tokens=200,
                                   tools=[harbour(require_approval={"never": {"read_only": True}})])
    assert bell.output[1].type == "mcp_approval_request", "a tool not annotated read-only waits"
    only_tide = client.responses.create(model=MODEL, input=ASK, tool_choice=forced(), max_output_tokens=200,
                                        tools=[harbour(allowed_tools=["tide"], require_approval="never")])
    assert [t.name for t in only_tide.output[0].tools] == ["tide", "ring_bell"]  # listed whole, offered one
    refused = httpx.post(f"{client.base_url}responses", json={
        "model": MODEL, "input": ASK, "tools": [harbour(allowed_tools=["tide"])],
        "tool_choice": forced("ring_bell")})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "tool_choice"


def test_streamed_calls_send_openais_mcp_events(client):
    events = list(client.responses.create(model=MODEL, input=ASK, tools=[harbour(require_approval="never")],
                                          tool_choice=forced(), max_output_tokens=200, stream=True))
    kinds = [e.type for e in events]
    for kind in ("response.mcp_list_tools.in_progress", "response.mcp_list_tools.completed",
                 "response.mcp_call.in_progress", "response.mcp_call_arguments.delta",
                 "response.mcp_call_arguments.done", "response.mcp_call.completed"):
        assert kind in kinds, kind
    assert kinds.index("response.mcp_call_arguments.done") < kinds.index("response.mcp_call.completed")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.type for i in done[:2]] == ["mcp_list_tools", "mcp_call"] and done[1].output.startswith("High water")
    added = [(e.output_index, e.item.type) for e in events if e.type == "response.output_item.added"]
    assert added == [(e.output_index, e.item.type) for e in events if e.type == "response.output_item.done"]
    pieces = "".join(e.delta for e in events if e.type == "response.mcp_call_arguments.delta")
    assert pieces == done[1].arguments
    assert kinds[-1] == "response.completed" or kinds[-1] == "response.incomplete"
    assert events[-1].response.output[1].output == done[1].output


@pytest.mark.parametrize("tool, choice, status, param", [
    (harbour(server_url="https://mcp.example/mcp"), None, 400, "tools.0.server_url"),
    (harbour(headers={"Authorization": "Bearer x"}), None, 400, "tools.0.headers"),
    (harbour(authorization="token"), None, 400, "tools.0.authorization"),
    ({"type": "mcp", "server_label": "nowhere"}, None, 400, "tools"),
    ({"type": "mcp", "server_label": "nowhere", "server_url": "http://127.0.0.1:1/mcp"}, None, 400, "tools"),
    (harbour(), forced("nope"), 400, "tool_choice"),
])
def test_what_a_request_may_not_name_is_refused(server, tool, choice, status, param):
    body = {"model": MODEL, "input": ASK, "tools": [tool], **({"tool_choice": choice} if choice else {})}
    refused = httpx.post(f"{server}/v1/responses", json=body, timeout=60)
    assert refused.status_code == status, refused.text
    assert refused.json()["error"]["param"] == param


def test_an_approval_of_nothing_asked_is_a_400(server):
    refused = httpx.post(f"{server}/v1/responses", timeout=60, json={"model": MODEL, "tools": [harbour()], "input": [
        {"type": "mcp_approval_response", "approve": True, "approval_request_id": "mcpr_made_up"}]})
    assert refused.status_code == 400 and "mcpr_made_up" in refused.json()["error"]["message"]


def test_a_server_for_admins_is_refused_to_others(settings, engine, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("responses-mcp-accounts")
    register(settings, data_dir, harbour=(HARBOUR, True))
    add_user(data_dir, "alice", "--admin")
    add_user(data_dir, "bob")
    with own_server(settings, engine, data_dir) as url:
        keys = {name: serge(data_dir, "keys", "create", name, "--name", "t").strip() for name in ("alice", "bob")}
        body = {"model": MODEL, "input": ASK, "tools": [harbour(require_approval="never")], "tool_choice": forced(),
                "max_output_tokens": 200}
        bob = httpx.post(f"{url}/v1/responses", json=body, timeout=60,
                         headers={"Authorization": f"Bearer {keys['bob']}"})
        assert bob.status_code == 403 and "harbour" in bob.json()["error"]["message"]
        alice = httpx.post(f"{url}/v1/responses", json=body, timeout=60,
                           headers={"Authorization": f"Bearer {keys['alice']}"})
        assert alice.status_code == 200 and alice.json()["output"][1]["type"] == "mcp_call"


def test_an_approval_without_its_servers_tool_is_a_400(client, server):
    first = client.responses.create(model=MODEL, input=ASK, tools=[harbour()], tool_choice=forced(),
                                    max_output_tokens=200)
    refused = httpx.post(f"{server}/v1/responses", timeout=60, json={
        "model": MODEL, "previous_response_id": first.id,
        "input": [{"type": "mcp_approval_response", "approve": True, "approval_request_id": first.output[1].id}]})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "tools"


def test_with_serge_tool_steps_spent_the_model_is_offered_no_tool_and_answers(settings, engine, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("responses-mcp-steps")
    register(settings, data_dir, harbour=(HARBOUR, False))
    with own_server(settings, engine, data_dir, tool_steps=0) as url:
        response = OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120).responses.create(
            model=MODEL, input=ASK, tools=[harbour(require_approval="never")], tool_choice=forced(),
            max_output_tokens=200)
    assert [i.type for i in response.output] == ["mcp_list_tools", "message"]


@pytest.mark.real_model
def test_the_real_model_calls_the_clock_and_answers_after_its_output(real_settings, engines, tmp_path_factory):
    from conftest import MODEL as REAL

    data_dir = tmp_path_factory.mktemp("responses-mcp-real")
    register(real_settings, data_dir, clock=(CLOCK, False))
    with own_server(real_settings, engines("auto"), data_dir) as url:
        response = OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=300).responses.create(
            model=REAL, input="What time is it now in the Europe/Paris timezone?", temperature=0,
            tools=[{"type": "mcp", "server_label": "clock", "require_approval": "never"}],
            tool_choice=forced("get_current_time", "clock"), max_output_tokens=60)
    listed, call, *rest = response.output
    assert listed.type == "mcp_list_tools" and call.type == "mcp_call" and call.name == "get_current_time"
    assert call.output is not None or call.error is not None
    if call.output is not None:  # the server's answer: the time where the model asked
        assert json.loads(call.arguments)["timezone"] in call.output
    assert rest and rest[-1].type == "message" and response.output_text


def test_a_call_of_the_clients_own_function_ends_the_response_beside_mcp_tools(client):
    weather = {"type": "function", "name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}
    response = client.responses.create(model=MODEL, input="Weather in Paris?", max_output_tokens=200,
                                       tools=[weather, harbour(require_approval="never", allowed_tools=["tide"])],
                                       tool_choice={"type": "function", "name": "get_weather"})
    assert [i.type for i in response.output] == ["mcp_list_tools", "function_call"]
    assert [t.type for t in response.tools] == ["function", "mcp"]
    assert response.tools[1].server_label == "harbour" and response.tools[1].allowed_tools == ["tide"]


def test_a_server_that_cannot_be_reached_is_listed_with_its_error_and_the_model_answers_without_it(client):
    events = list(client.responses.create(model=MODEL, input=ASK, max_output_tokens=4, stream=True,
                                          tools=[{"type": "mcp", "server_label": "broken"}]))
    kinds = [e.type for e in events]
    assert "response.mcp_list_tools.failed" in kinds and "response.mcp_list_tools.completed" not in kinds
    final = events[-1].response
    listed = final.output[0]
    assert listed.type == "mcp_list_tools" and listed.tools == [] and listed.error
    assert final.output[-1].type == "message"


@pytest.mark.parametrize("tool", [harbour(require_approval="sometimes"), harbour(allowed_tools=["t"] * 300),
                                  harbour(unknown_field=1), {"type": "mcp"}, harbour(server_label="x" * 100),
                                  harbour(require_approval={"always": {"tool_names": "tide"}})])
def test_a_malformed_mcp_tool_is_a_400_naming_it(server, tool):
    refused = httpx.post(f"{server}/v1/responses", json={"model": MODEL, "input": ASK, "tools": [tool]}, timeout=60)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"].startswith("tools"), refused.text


def test_a_streamed_approval_round_trip(client):
    first = list(client.responses.create(model=MODEL, input=ASK, tools=[harbour()], tool_choice=forced(),
                                         max_output_tokens=200, stream=True))
    added = [e.item for e in first if e.type == "response.output_item.added"]
    assert [i.type for i in added] == ["mcp_list_tools", "mcp_approval_request"]
    assert "response.mcp_call.in_progress" not in [e.type for e in first], "nothing runs before it is approved"
    asked = first[-1].response.output[1]
    assert asked.type == "mcp_approval_request" and json.loads(asked.arguments)["place"]
    second = list(client.responses.create(model=MODEL, previous_response_id=first[-1].response.id, stream=True,
                                          tools=[harbour()], max_output_tokens=8, input=[
                                              {"type": "mcp_approval_response", "approve": True,
                                               "approval_request_id": asked.id}]))
    kinds = [e.type for e in second]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds.index("response.mcp_call.in_progress") < kinds.index("response.mcp_call.completed")
    call = next(e.item for e in second if e.type == "response.output_item.done")
    assert call.type == "mcp_call" and call.approval_request_id == asked.id and call.output.startswith("High water")


def test_a_call_whose_stream_left_its_id_out_is_matched_to_its_item():
    from serge.chats.tools import CallDone, CallRunning, OfferedTool
    from serge.engine import Delta, ToolCall
    from serge.engine.generation.stream import ToolCallDelta
    from serge.tools import ToolOutcome, ToolSpec
    from serge.web.responses.mcp_output import McpOutputItems

    tide = OfferedTool(ToolSpec("harbour", "tide", "", {}, True), needs_approval=False)
    items = McpOutputItems(False, {"tide": tide})
    items.next_pass()
    items.add(Delta(tool_calls=(ToolCallDelta(0, None, "tide", '{"place": '),)))
    items.add(Delta(tool_calls=(ToolCallDelta(0, arguments='"Skerry"}'),)))
    call = ToolCall("call_from_the_record", "tide", '{"place": "Skerry"}')  # a remote server's record names it
    items.running(CallRunning(call, tide))
    items.called(CallDone(call, tide, ToolOutcome("noon", False, False), "done"))
    [item] = items.output
    assert (item["type"], item["status"], item["output"], item["arguments"]) == (
        "mcp_call", "completed", "noon", '{"place": "Skerry"}')


def test_the_model_is_told_a_denied_call_was_not_run_and_given_an_approved_calls_output(tmp_path_factory):
    recorder = Recording(standin_model())
    data_dir = tmp_path_factory.mktemp("responses-mcp-told")
    own = Settings(data_dir=data_dir, models_dir=tmp_path_factory.mktemp("no-models"), default_model=MODEL)
    register(own, data_dir, harbour=(HARBOUR, False))
    try:
        with Engine(own, backends={MODEL: recorder}) as engine, own_server(own, engine, data_dir) as url:
            client = OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120)
            for approve in (False, True):
                first = client.responses.create(model=MODEL, input=ASK, tools=[harbour()], tool_choice=forced(),
                                                max_output_tokens=200)
                asked = first.output[1]
                client.responses.create(model=MODEL, previous_response_id=first.id, tools=[harbour()],
                                        max_output_tokens=4, input=[{"type": "mcp_approval_response",
                                                                     "approve": approve,
                                                                     "approval_request_id": asked.id}])
                *_, call, told = recorder.asked[-1]
                assert call.role == "assistant" and call.tool_calls[0].name == "tide"
                assert told.role == "tool" and told.tool_call_id == call.tool_calls[0].id
                place = json.loads(asked.arguments)["place"]
                assert told.content == (f"High water at {place} is at noon." if approve else DENIED)
    finally:
        recorder.model.close()
