"""OpenAI's Responses API on a real server, through the official `openai` client and the OpenAI Agents
SDK: text, the typed stream, function calls answered through previous_response_id, stored responses
(retrieve, delete, input items, whose they are), structured output, hosted tools left out, the window,
bad input, and the same guards as every route. The shapes are checked on the stand-in model
(standin.py); a whole response, a stream and an agent's tool call go through the real model on each
local engine too (`real_model`)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time

import httpx
import openai
import pytest
from openai import OpenAI
from openai.types.responses import Response

from conftest import MODEL as REAL, ServerThread, server_of_its_own, held_port
from standin import NAME as MODEL, stand_in
from test_openai_dialect import City
from test_accounts_api import add_user, serge

from serge.web.app import build_app

settings, engine = stand_in("settings", "engine")
server = server_of_its_own()

WEATHER = {"type": "function", "name": "get_weather", "description": "Get the current weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                          "required": ["city"], "additionalProperties": False}, "strict": True}
ASK_WEATHER = "What is the weather like in Paris today?"
HOSTED = [{"type": "web_search"}, {"type": "web_search_preview"}, {"type": "file_search", "vector_store_ids": ["v"]},
          {"type": "code_interpreter", "container": {"type": "auto"}}, {"type": "image_generation"},
          {"type": "local_shell"}]  # an mcp tool is Serge's to run (test_responses_mcp.py)


def openai_client(url: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key="not-needed", max_retries=0)


@pytest.fixture(scope="module")
def client(server) -> OpenAI:
    return openai_client(server)


def post(server, body, model: str = MODEL, **kwargs) -> httpx.Response:
    return httpx.post(f"{server}/v1/responses", json={"model": model, **body}, timeout=300, **kwargs)


def generated(engine) -> int:
    return engine.metrics.snapshot()[MODEL].requests


# --- text ------------------------------------------------------------------------------------------
@pytest.mark.real_model
def test_a_text_response_is_a_response_object_the_sdk_validates(real_server):
    client, server = openai_client(real_server), real_server  # the real model, on each local engine
    reply = client.responses.create(model=REAL, input="What is the capital of France?", max_output_tokens=40,
                                    temperature=0, instructions="Answer in one short sentence.")
    assert reply.id.startswith("resp_") and reply.object == "response" and reply.model == REAL
    assert reply.status in ("completed", "incomplete") and reply.error is None
    assert reply.output_text and reply.output[0].type == "message" and reply.output[0].role == "assistant"
    assert reply.usage.total_tokens == reply.usage.input_tokens + reply.usage.output_tokens
    assert 0 < reply.usage.output_tokens <= 40
    assert reply.instructions == "Answer in one short sentence." and reply.store is True
    if reply.status == "incomplete":
        assert reply.incomplete_details.reason == "max_output_tokens" and reply.usage.output_tokens == 40
    raw = post(server, {"input": "Say hello.", "max_output_tokens": 8, "temperature": 0}, REAL)
    assert raw.status_code == 200, raw.text
    Response.model_validate(raw.json())  # every field the SDK's own model requires, with its types


def test_a_reply_cut_by_max_output_tokens_is_incomplete(client):
    reply = client.responses.create(model=MODEL, input="Write a long story about a dragon.", max_output_tokens=5,
                                    temperature=0)
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    assert reply.output[0].status == "incomplete" and reply.usage.output_tokens == 5


# --- the stream ------------------------------------------------------------------------------------
TEXT_EVENTS = ["response.created", "response.in_progress", "response.output_item.added",
               "response.content_part.added", "response.output_text.delta", "response.output_text.done",
               "response.content_part.done", "response.output_item.done"]


@pytest.mark.real_model
def test_a_stream_sends_the_typed_events_in_order_and_its_deltas_add_up(real_server):
    client = openai_client(real_server)  # the real model, on each local engine
    events = list(client.responses.create(model=REAL, input="Name three colours.", max_output_tokens=30,
                                          temperature=0, stream=True))
    kinds = [e.type for e in events]
    collapsed = [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1]]  # runs of deltas as one
    assert collapsed[:-1] == TEXT_EVENTS and collapsed[-1] in ("response.completed", "response.incomplete")
    numbers = [e.sequence_number for e in events]
    assert numbers == sorted(set(numbers)) and numbers[0] == 0
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = next(e for e in events if e.type == "response.output_text.done")
    final = events[-1].response
    assert deltas == done.text == final.output_text and deltas
    assert events[0].response.status == "in_progress" and events[0].response.id == final.id
    assert final.usage.output_tokens > 0
    assert client.responses.retrieve(final.id).output_text == deltas  # stored once finished


def test_a_streamed_function_call_sends_its_arguments_in_pieces(client):
    events = list(client.responses.create(model=MODEL, input=ASK_WEATHER, tools=[WEATHER], tool_choice="required",
                                          temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds and "response.output_text.delta" not in kinds
    added = next(e for e in events if e.type == "response.output_item.added")
    assert added.item.type == "function_call" and added.item.name == "get_weather"
    pieces = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert pieces == done.arguments and "city" in json.loads(pieces)
    assert kinds.index("response.function_call_arguments.done") < kinds.index("response.output_item.done")
    assert events[-1].type == "response.completed" and events[-1].response.output[0].arguments == pieces


# --- function calls and previous_response_id -------------------------------------------------------
def test_a_required_call_is_answered_with_its_output_through_previous_response_id(client):
    first = client.responses.create(model=MODEL, input=ASK_WEATHER, tools=[WEATHER], tool_choice="required",
                                    temperature=0)
    assert first.status == "completed"
    call = first.output[0]
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    assert isinstance(json.loads(call.arguments)["city"], str)
    answer = [{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny and 25 degrees."}]
    second = client.responses.create(model=MODEL, previous_response_id=first.id, input=answer, tools=[WEATHER],
                                     tool_choice="none", temperature=0, max_output_tokens=40)
    assert second.previous_response_id == first.id and second.output[0].type == "message"
    assert second.output_text
    # the model saw the whole chain: the same prompt as sending the conversation whole
    whole = client.responses.create(model=MODEL, input=[
        {"role": "user", "content": ASK_WEATHER},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        *answer], tools=[WEATHER], tool_choice="none", temperature=0, max_output_tokens=40, store=False)
    alone = client.responses.create(model=MODEL, input=ASK_WEATHER, tools=[WEATHER], tool_choice="none",
                                    max_output_tokens=1, store=False)
    assert second.usage.input_tokens == whole.usage.input_tokens > alone.usage.input_tokens
    assert second.output_text == whole.output_text


def test_a_previous_response_id_that_does_not_exist_is_a_404(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model=MODEL, previous_response_id="resp_nothing", input="Hi", max_output_tokens=2)
    error = caught.value.body
    assert error["code"] == "previous_response_not_found" and error["param"] == "previous_response_id"


# --- stored responses ------------------------------------------------------------------------------
def test_a_stored_response_is_retrieved_listed_and_deleted(client, server):
    made = client.responses.create(model=MODEL, temperature=0, max_output_tokens=10, metadata={"run": "7"}, input=[
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "Hello"}, {"type": "input_text", "text": "!"}]}])
    got = client.responses.retrieve(made.id)
    assert got.model_dump() == made.model_dump()
    Response.model_validate(httpx.get(f"{server}/v1/responses/{made.id}").json())
    newest_first = client.responses.input_items.list(made.id)
    assert [i.role for i in newest_first.data] == ["user", "developer"]
    assert newest_first.data[0].content[0].text == "Hello!" and newest_first.has_more is False
    oldest = client.responses.input_items.list(made.id, order="asc", limit=1)
    assert [i.role for i in oldest.data] == ["developer"] and oldest.has_more is True
    after = client.responses.input_items.list(made.id, order="asc", after=oldest.data[0].id)
    assert [i.role for i in after.data] == ["user"]
    client.responses.delete(made.id)
    for gone in (lambda: client.responses.retrieve(made.id), lambda: client.responses.delete(made.id),
                 lambda: client.responses.input_items.list(made.id)):
        with pytest.raises(openai.NotFoundError):
            gone()
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, previous_response_id=made.id, input="And?", max_output_tokens=2)


def test_store_false_keeps_nothing(client):
    made = client.responses.create(model=MODEL, input="Hi", max_output_tokens=4, store=False)
    assert made.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(made.id)


def test_a_client_that_goes_away_cancels_its_generation_and_nothing_is_stored(server, engine, client):
    def cancelled() -> float:
        return engine.metrics.registry.get_sample_value(
            "serge_requests_total", {"model": MODEL, "reason": "cancelled"}) or 0.0

    before = cancelled()
    essay = {"type": "json_schema", "name": "essay", "strict": True, "schema": {  # cannot end early
        "type": "object", "properties": {"essay": {"type": "string", "minLength": 3000}}, "required": ["essay"]}}
    response_id = None
    with httpx.stream("POST", f"{server}/v1/responses", timeout=60, json={
            "model": MODEL, "input": "Write an essay.", "stream": True, "max_output_tokens": 4000,
            "text": {"format": essay}}) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: ") and (event := json.loads(line[6:]))["type"] == "response.created":
                response_id = event["response"]["id"]
            if line.startswith("data: ") and event["type"] == "response.output_text.delta":
                break
    deadline = time.monotonic() + 20
    while cancelled() == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cancelled() == before + 1, "the abandoned generation was not cancelled"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response_id)


# --- structured output, hosted tools, the window ---------------------------------------------------
@pytest.mark.parametrize("temperature,seed", [(0, 0), (1.0, 2)])
def test_a_json_schema_reply_parses_and_validates(client, temperature, seed):
    reply = client.responses.parse(model=MODEL, input="Describe Paris as a JSON object.", text_format=City,
                                   temperature=temperature, max_output_tokens=150)
    assert reply.status == "completed", reply.output_text
    assert isinstance(reply.output_parsed, City)
    assert City.model_validate_json(reply.output_text) == reply.output_parsed
    assert reply.text.format.type == "json_schema" and reply.text.format.name == "City"


def test_json_object_format_gives_a_json_object(client):
    reply = client.responses.create(model=MODEL, input="Describe a person as JSON with a name and an age.",
                                    max_output_tokens=200, temperature=0, text={"format": {"type": "json_object"}})
    assert reply.status == "completed" and isinstance(json.loads(reply.output_text), dict)


def test_hosted_tools_are_left_out_of_what_the_model_is_offered_and_named_in_the_log(server, caplog):
    caplog.set_level(logging.INFO, logger="serge.requests")
    reply = post(server, {"input": "Hello", "max_output_tokens": 4, "tools": [*HOSTED, WEATHER],
                          "include": ["web_search_call.action.sources", "reasoning.encrypted_content"],
                          "reasoning": {"effort": "low", "summary": "auto"}, "prompt_cache_key": "k",
                          "client_metadata": {"x": "y"}, "safety_identifier": "s", "parallel_tool_calls": False})
    assert reply.status_code == 200, reply.text
    assert [t["name"] for t in reply.json()["tools"]] == ["get_weather"]
    assert not reply.json()["parallel_tool_calls"]
    only_hosted = post(server, {"input": "Hello", "max_output_tokens": 4, "tools": HOSTED, "tool_choice": "auto"})
    assert only_hosted.status_code == 200 and only_hosted.json()["tools"] == []
    logged = [r.getMessage() for r in caplog.records if r.name == "serge.requests" and "/v1/responses" in
              r.getMessage()]
    assert any('tools_left_out="code_interpreter,file_search,image_generation,local_shell,web_search,'
               'web_search_preview"' in line for line in logged), logged


def test_a_conversation_longer_than_the_window_is_a_400_with_the_counts_unless_truncation_is_auto(small_standin_server):
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"Tell me fact number {i} about the "
              f"history, geography and people of the city of Paris, in France, please."} for i in range(41)]
    refused = post(small_standin_server, {"input": turns, "max_output_tokens": 16})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "input"
    needed, window = map(int, re.search(r"needs (\d+) tokens.*window is (\d+)", error["message"]).groups())
    assert window == 512 and needed > 1000
    cut = post(small_standin_server, {"input": turns, "max_output_tokens": 16, "truncation": "auto"})
    assert cut.status_code == 200, cut.text
    assert cut.json()["truncation"] == "auto" and cut.json()["usage"]["input_tokens"] < 512


# --- bad input -------------------------------------------------------------------------------------
@pytest.mark.parametrize("body, param", [
    ({"input": "Hi", "frequency_penalty": 1}, "frequency_penalty"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input.0"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x.example/a.png"}]}]},
     "input.0.content.0.image_url"),
    ({"input": [{"type": "function_call", "name": "f"}]}, "input.0.function_call.call_id"),
    ({"input": []}, "input"),
    ({"input": "Hi", "temperature": 5}, "temperature"),
    ({"input": "Hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "Hi", "tools": [WEATHER], "tool_choice": {"type": "web_search"}}, "tool_choice"),
    ({"input": "Hi", "tool_choice": "required"}, "tool_choice"),
    ({"input": "Hi", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format"),
    ({"input": "Hi", "truncation": "sometimes"}, "truncation"),
    ({"input": "Hi", "background": True}, "background"),
    ({"input": "Hi", "max_output_tokens": 10**6}, "max_output_tokens"),
])
def test_bad_input_is_a_400_naming_the_field(server, body, param):
    response = post(server, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error


def test_explicit_nulls_are_unset(server):
    body = {"input": "Hi", "max_output_tokens": 4, **{k: None for k in (
        "instructions", "previous_response_id", "store", "stream", "tools", "tool_choice", "text", "temperature",
        "top_p", "truncation", "include", "reasoning", "metadata", "user", "parallel_tool_calls", "top_logprobs",
        "prompt_cache_key", "safety_identifier", "client_metadata", "service_tier", "stream_options")}}
    response = post(server, body)
    assert response.status_code == 200, response.text
    assert response.json()["store"] is True and response.json()["truncation"] == "disabled"


def test_logprobs_come_with_each_output_token_when_included(client):
    reply = client.responses.create(model=MODEL, input="Say yes.", max_output_tokens=5, temperature=0,
                                    top_logprobs=2, include=["message.output_text.logprobs"])
    part = reply.output[0].content[0]
    assert "".join(t.token for t in part.logprobs) == part.text
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in part.logprobs)


@pytest.fixture(scope="module")
def far(settings, tmp_path_factory):
    """A server whose default model is a remote one that hangs up mid-reply."""
    from test_faults import FarServer, answers_then_hangs_up

    from serge.engine import Engine
    from serge.settings import RemoteModel

    drop = FarServer(answers_then_hangs_up)
    own = settings.model_copy(update={"data_dir": tmp_path_factory.mktemp("far"), "port": held_port(),
                                      "default_model": "far-drop",
                                      "remote_models": {"far-drop": RemoteModel(url=drop.url)}})
    with Engine(own) as engine, ServerThread(build_app(own, engine), own.port) as running:
        yield OpenAI(base_url=f"{running.url}/v1", api_key="not-needed", max_retries=0)
    drop.close()


def test_a_generation_that_fails_mid_stream_ends_with_an_error_event_and_nothing_is_stored(far):
    events = list(far.responses.create(model="far-drop", input="Hello?", stream=True))
    kinds = [e.type for e in events]
    assert kinds[-1] == "error" and "response.completed" not in kinds
    assert events[-1].code == "remote_model_failed" and "closed the connection" in events[-1].message
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Half of an answer"
    created = events[0].response.id
    with pytest.raises(openai.NotFoundError):
        far.responses.retrieve(created)
    with pytest.raises(openai.APIStatusError) as caught:
        far.responses.create(model="far-drop", input="Hello?")
    assert caught.value.status_code == 502 and caught.value.body["code"] == "remote_model_failed"


# --- the same guards as every route ----------------------------------------------------------------
def test_a_hostile_host_or_a_cross_site_post_is_refused_and_generates_nothing(server, engine):
    runs = generated(engine)
    rebound = post(server, {"input": "Hi", "max_output_tokens": 2}, headers={"Host": "evil.example"})
    assert rebound.status_code == 421
    cross = post(server, {"input": "Hi", "max_output_tokens": 2}, headers={"Origin": "http://evil.example"})
    assert cross.status_code == 403 and "other sites" in cross.json()["error"]["message"]
    marked = post(server, {"input": "Hi", "max_output_tokens": 2}, headers={"Sec-Fetch-Site": "cross-site"})
    assert marked.status_code == 403
    assert generated(engine) == runs


def test_the_docs_describe_the_routes(server):
    spec = httpx.get(f"{server}/openapi.json", timeout=60).json()
    assert {"/v1/responses", "/v1/responses/{response_id}", "/v1/responses/{response_id}/input_items"} <= set(
        spec["paths"])
    assert "web_search" in spec["paths"]["/v1/responses"]["post"]["description"]
    assert {"input", "previous_response_id", "truncation", "store"} <= set(
        spec["components"]["schemas"]["CreateResponse"]["properties"])


@pytest.fixture(scope="module")
def accounts(engine, settings, tmp_path_factory):
    """A server with accounts: alice and bob, each with an API key."""
    own = settings.model_copy(update={"data_dir": tmp_path_factory.mktemp("owners"), "port": held_port()})
    with ServerThread(build_app(own, engine), own.port) as running:
        keys = {}
        for name in ("alice", "bob"):
            add_user(own.data_dir, name)
            keys[name] = serge(own.data_dir, "keys", "create", name, "--name", "test").strip()
        yield running.url, {name: OpenAI(base_url=f"{running.url}/v1", api_key=key, max_retries=0)
                            for name, key in keys.items()}


def test_a_response_is_its_owners_alone(accounts):
    url, clients = accounts
    alice, bob = clients["alice"], clients["bob"]
    made = alice.responses.create(model=MODEL, input="Hi", max_output_tokens=4)
    assert alice.responses.retrieve(made.id).id == made.id
    for theirs in (lambda: bob.responses.retrieve(made.id), lambda: bob.responses.input_items.list(made.id),
                   lambda: bob.responses.delete(made.id),
                   lambda: bob.responses.create(model=MODEL, previous_response_id=made.id, input="And?",
                                                max_output_tokens=2)):
        with pytest.raises(openai.NotFoundError):
            theirs()
    assert alice.responses.retrieve(made.id).id == made.id  # bob's delete changed nothing
    for method, path in (("POST", "/v1/responses"), ("GET", f"/v1/responses/{made.id}"),
                         ("DELETE", f"/v1/responses/{made.id}"), ("GET", f"/v1/responses/{made.id}/input_items")):
        anonymous = httpx.request(method, url + path, json={"model": MODEL, "input": "Hi"} if method == "POST"
                                  else None)
        assert anonymous.status_code == 401, (method, path)
    assert alice.responses.retrieve(made.id).id == made.id


# --- the OpenAI Agents SDK (its default model: the Responses API) ----------------------------------
@pytest.mark.real_model
def test_an_agent_whose_tool_must_be_called_runs_it_and_finishes(real_server):
    server = real_server
    from agents import (Agent, ModelSettings, Runner, function_tool, set_default_openai_api,
                        set_default_openai_client, set_tracing_disabled)
    from openai import AsyncOpenAI

    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        calls.append(city)
        return f"It is sunny in {city}."

    async def run():
        set_tracing_disabled(True)
        set_default_openai_api("responses")  # the SDK's default, said out loud
        set_default_openai_client(AsyncOpenAI(base_url=f"{server}/v1", api_key="not-needed", max_retries=0),
                                  use_for_tracing=False)
        agent = Agent(name="weather", instructions="You answer questions about the weather.", model=REAL,
                      tools=[get_weather], tool_use_behavior="stop_on_first_tool",
                      model_settings=ModelSettings(tool_choice="required", temperature=0))
        whole = await Runner.run(agent, ASK_WEATHER)
        streamed = Runner.run_streamed(agent, ASK_WEATHER)
        kinds = [event.type async for event in streamed.stream_events()]
        return whole, streamed, kinds

    whole, streamed, kinds = asyncio.run(run())
    assert len(calls) == 2 and all(calls)
    assert whole.final_output == f"It is sunny in {calls[0]}."
    assert streamed.final_output == f"It is sunny in {calls[1]}." and "raw_response_event" in kinds
