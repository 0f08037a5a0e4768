"""Anthropic's Messages API through the official `anthropic` client: create, the event stream, a forced
tool_use and its tool_result, count_tokens, errors in Anthropic's shape, x-api-key with accounts on, the
Host and cross-site checks, max_tokens capped to the window and a conversation too long for it refused
with its counts. The shapes are checked on the stand-in model (standin.py); a whole reply, a stream and
a forced tool_use go through the real model on each local engine too (`real_model`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import httpx
import pytest
from pydantic import BaseModel, Field

from serge.settings import Settings
from serge.web.app import build_app

from conftest import MODEL as REAL, SMALL_WINDOW, ServerThread, server_of_its_own, held_port
from standin import NAME as MODEL, stand_in
from test_accounts_api import add_user, serge

if TYPE_CHECKING:
    from anthropic import Anthropic

settings, engine = stand_in("settings", "engine")
server = server_of_its_own()

WEATHER = {"name": "get_weather", "description": "Get the current weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                            "required": ["city"]}}
ASK_WEATHER = [{"role": "user", "content": "What is the weather like in Paris today?"}]
HELLO = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0}  # the client no longer has temperature among its arguments; clients still send it
TOOL_ROOM = 120  # tokens for a tool call: the stand-in's tokens are bytes, and a call is about 70
EVENTS = ("message_start", "ping", "content_block_start", "content_block_delta", "content_block_stop",
          "message_delta", "message_stop")


def anthropic_client(url: str, **options) -> Anthropic:
    """The official client, imported here: `anthropic` takes 1.4 s to import, which every xdist worker paid at
    collection whether or not it ran this module."""
    from anthropic import Anthropic

    return Anthropic(**{"base_url": url, "api_key": "not-needed", "max_retries": 0, "timeout": 300, **options})


@pytest.fixture(scope="module")
def client(server) -> Anthropic:
    return anthropic_client(server)


def events(url: str, body: dict, model: str = MODEL, **kwargs) -> list[tuple[str, dict]]:
    """The raw server-sent events of a streamed message: (event name, data), pings included."""
    out = []
    with httpx.stream("POST", f"{url}/v1/messages", json={"model": model, "stream": True, **body}, timeout=300,
                      **kwargs) as response:
        assert response.status_code == 200, response.read()
        kind = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                kind = line[len("event: "):]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: "):])
                assert data["type"] == kind
                out.append((kind, data))
    return out


# --- create and stream ---------------------------------------------------------------------------------
@pytest.mark.real_model
def test_create_answers_in_anthropics_shape(real_server):
    client = anthropic_client(real_server)  # the real model, on each local engine
    message = client.messages.create(model=REAL, max_tokens=40, messages=HELLO, extra_body=GREEDY)
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert message.model == REAL
    assert [b.type for b in message.content] == ["text"] and message.content[0].text.strip()
    assert message.stop_reason in ("end_turn", "max_tokens") and message.stop_sequence is None
    assert message.usage.input_tokens > 5 and 0 < message.usage.output_tokens <= 40
    short = client.messages.create(model=REAL, max_tokens=2, messages=HELLO, extra_body=GREEDY)
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 2


@pytest.mark.real_model
def test_a_stream_sends_every_event_in_order_and_adds_up_to_the_whole_reply(real_server):
    client, url = anthropic_client(real_server), real_server  # the real model, on each local engine
    whole = client.messages.create(model=REAL, max_tokens=30, messages=HELLO, extra_body=GREEDY)
    seen = events(url, {"max_tokens": 30, "messages": HELLO, **GREEDY}, REAL)
    kinds = [k for k, _ in seen]
    assert kinds[:3] == ["message_start", "ping", "content_block_start"]
    assert set(kinds[3:-3]) == {"content_block_delta"} and len(kinds[3:-3]) > 1
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    start = seen[0][1]["message"]
    assert start["id"].startswith("msg_") and start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] == whole.usage.input_tokens
    text = "".join(d["delta"]["text"] for k, d in seen if k == "content_block_delta")
    assert all(d["delta"]["type"] == "text_delta" for k, d in seen if k == "content_block_delta")
    assert text == whole.content[0].text
    end = seen[-2][1]
    assert end["delta"]["stop_reason"] == whole.stop_reason
    assert end["usage"]["output_tokens"] == whole.usage.output_tokens
    with client.messages.stream(model=REAL, max_tokens=30, messages=HELLO, extra_body=GREEDY) as stream:
        final = stream.get_final_message()
    assert final.content[0].text == whole.content[0].text and final.usage.output_tokens == whole.usage.output_tokens


def test_a_stop_sequence_ends_the_reply_and_is_named(client):
    whole = client.messages.create(model=MODEL, max_tokens=30, messages=HELLO, extra_body=GREEDY).content[0].text
    words = whole.split()
    assert len(words) > 3, whole
    stop = words[2]
    cut = client.messages.create(model=MODEL, max_tokens=30, messages=HELLO, stop_sequences=[stop], extra_body=GREEDY)
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == whole[: whole.index(stop)]


# --- tools ----------------------------------------------------------------------------------------------
@pytest.mark.real_model
def test_tool_choice_any_forces_a_tool_use_whose_input_meets_the_schema(real_server):
    client, url = anthropic_client(real_server), real_server  # the real model, on each local engine
    message = client.messages.create(model=REAL, max_tokens=60, messages=ASK_WEATHER, tools=[WEATHER],
                                     tool_choice={"type": "any"}, extra_body=GREEDY)
    assert message.stop_reason == "tool_use"
    use = [b for b in message.content if b.type == "tool_use"][0]
    assert use.id.startswith("toolu_") and use.name == "get_weather"
    assert isinstance(use.input["city"], str) and len(use.input["city"]) <= 40
    seen = events(url, {"max_tokens": 60, "messages": ASK_WEATHER, "tools": [WEATHER], "tool_choice": {"type": "any"},
                        **GREEDY}, REAL)
    block = next(d["content_block"] for k, d in seen if k == "content_block_start"
                 and d["content_block"]["type"] == "tool_use")
    assert block["name"] == "get_weather" and block["id"].startswith("toolu_") and block["input"] == {}
    pieces = [d["delta"] for k, d in seen if k == "content_block_delta" and d["delta"]["type"] == "input_json_delta"]
    assert len(pieces) > 1 and json.loads("".join(p["partial_json"] for p in pieces)) == use.input
    assert next(d for k, d in seen if k == "message_delta")["delta"]["stop_reason"] == "tool_use"


def test_a_named_tool_is_used(client):
    clock = {"name": "get_time", "description": "Get the time in a timezone.",
             "input_schema": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 40}},
                              "required": ["timezone"]}}
    message = client.messages.create(model=MODEL, max_tokens=TOOL_ROOM, messages=ASK_WEATHER, tools=[WEATHER, clock],
                                     tool_choice={"type": "tool", "name": "get_time"}, extra_body=GREEDY)
    assert [b.name for b in message.content if b.type == "tool_use"] == ["get_time"]


def test_a_tool_result_goes_back_and_the_model_answers_in_text(client):
    first = client.messages.create(model=MODEL, max_tokens=TOOL_ROOM, messages=ASK_WEATHER, tools=[WEATHER],
                                   tool_choice={"type": "any"}, extra_body=GREEDY)
    use = [b for b in first.content if b.type == "tool_use"][0]
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                           "content": [{"type": "text", "text": '{"sky": "sunny", "temp_c": 24}'}]}]}
    history = [*ASK_WEATHER, {"role": "assistant", "content": first.content}, result]
    second = client.messages.create(model=MODEL, max_tokens=40, messages=history, tools=[WEATHER],
                                    tool_choice={"type": "none"}, extra_body=GREEDY)
    assert second.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in second.content] == ["text"] and second.content[0].text.strip()
    longer = [*history[:2], {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                          "content": '{"sky": "sunny", "temp_c": 24}' * 3}]}]
    counted = client.messages.count_tokens(model=MODEL, messages=longer, tools=[WEATHER], tool_choice={"type": "none"})
    assert counted.input_tokens > second.usage.input_tokens  # the result is in the prompt
    as_string = [*history[:2], {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                             "content": '{"sky": "sunny", "temp_c": 24}'}]}]
    same = client.messages.create(model=MODEL, max_tokens=40, messages=as_string, tools=[WEATHER],
                                  tool_choice={"type": "none"}, extra_body=GREEDY)
    assert same.content[0].text == second.content[0].text


class Address(BaseModel):
    street: str = Field(max_length=30)
    city: str = Field(max_length=20)


class Customer(BaseModel):
    name: str = Field(max_length=20)
    addresses: list[Address] = Field(min_length=1, max_length=2)


def test_a_tool_whose_input_schema_has_defs_is_used_validly(client):
    tool = {"name": "record_customer", "description": "Record a customer.",
            "input_schema": Customer.model_json_schema()}
    assert "$defs" in tool["input_schema"]
    message = client.messages.create(model=MODEL, max_tokens=200, messages=ASK_WEATHER, tools=[tool],
                                     tool_choice={"type": "any"})
    Customer.model_validate([b for b in message.content if b.type == "tool_use"][0].input)


def test_output_config_format_gives_json_that_meets_the_schema(client):
    message = client.messages.create(model=MODEL, max_tokens=200, messages=HELLO, output_config={"format": {
        "type": "json_schema", "schema": Address.model_json_schema()}})
    Address.model_validate_json(message.content[0].text)


# --- conversations as clients send them -----------------------------------------------------------------
def test_count_tokens_is_the_prompt_create_is_given(client):
    system = [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}]
    counted = client.messages.count_tokens(model=MODEL, messages=ASK_WEATHER, system=system, tools=[WEATHER])
    created = client.messages.create(model=MODEL, max_tokens=5, messages=ASK_WEATHER, system=system, tools=[WEATHER],
                                     extra_body=GREEDY)
    assert counted.input_tokens == created.usage.input_tokens
    bare = client.messages.count_tokens(model=MODEL, messages=ASK_WEATHER)
    assert bare.input_tokens < counted.input_tokens


def test_a_system_block_list_and_a_system_message_mid_conversation_are_accepted(client):
    blocks = [{"type": "text", "text": "You are terse."},
              {"type": "text", "text": "Answer in English.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    as_blocks = client.messages.count_tokens(model=MODEL, messages=HELLO, system=blocks)
    as_string = client.messages.count_tokens(model=MODEL, messages=HELLO, system="You are terse.\n\nAnswer in English.")
    assert as_blocks.input_tokens == as_string.input_tokens
    first_only = client.messages.count_tokens(model=MODEL, messages=HELLO, system=blocks[:1])
    assert as_blocks.input_tokens > first_only.input_tokens  # every block is in the prompt
    messages = [*HELLO, {"role": "assistant", "content": "Paris."}, {"role": "system", "content": "Now be brief."},
                {"role": "user", "content": "And of Italy?"}]
    reply = client.messages.create(model=MODEL, max_tokens=10, messages=messages, system=blocks, extra_body=GREEDY)
    assert reply.content[0].text.strip()
    without = client.messages.count_tokens(model=MODEL, messages=[m for m in messages if m["role"] != "system"],
                                           system=blocks)
    assert reply.usage.input_tokens > without.input_tokens  # the system message is in the prompt


def test_a_trailing_assistant_message_is_continued(client):
    ask = [{"role": "user", "content": "Tell me a long story about a dragon."}]
    prefill = [*ask, {"role": "assistant", "content": "Once upon a time"}]
    reply = client.messages.create(model=MODEL, max_tokens=10, messages=prefill, extra_body=GREEDY)
    text = reply.content[0].text
    assert text.strip() and not text.startswith("Once upon")
    fresh = client.messages.create(model=MODEL, max_tokens=10, messages=ask, extra_body=GREEDY)
    assert reply.usage.input_tokens > fresh.usage.input_tokens


def test_fields_without_effect_are_accepted(client, server):
    message = client.messages.create(
        model=MODEL, max_tokens=3, messages=[{"role": "user", "content": [
            {"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}}]}],
        metadata={"user_id": "someone"}, thinking={"type": "disabled"}, service_tier="auto",
        extra_body={"context_management": {"edits": []}, "output_config": {"effort": "low"}},
        extra_headers={"anthropic-beta": "prompt-caching-2024-07-31", "anthropic-version": "2023-06-01"},
        extra_query={"beta": "true"})
    assert message.content[0].type == "text"
    echoed = httpx.post(f"{server}/v1/messages", timeout=120, json={
        "model": MODEL, "max_tokens": 3, "stream": None, "system": None, "tools": None, "temperature": None,
        "messages": [{"role": "user", "content": "Hi", "id": "msg_from_an_earlier_reply"}]})
    assert echoed.status_code == 200, "null is a field not sent; a message's own unknown keys are ignored"
    doc = httpx.get(f"{server}/openapi.json", timeout=60).json()["paths"]["/v1/messages"]["post"]
    for field in ("cache_control", "thinking", "context_management", "output_config.effort", "beta=true"):
        assert field in doc["description"], field


# --- errors ---------------------------------------------------------------------------------------------
def test_errors_come_in_anthropics_shape_with_its_types(client, server):
    import anthropic

    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="claude-sonnet-4-5", max_tokens=5, messages=HELLO)
    assert missing.value.body == {"type": "error", "error": {"type": "not_found_error",
                                                             "message": missing.value.body["error"]["message"]}}
    assert "claude-sonnet-4-5" in missing.value.body["error"]["message"]
    no_max = httpx.post(f"{server}/v1/messages", json={"model": MODEL, "messages": HELLO})
    assert no_max.status_code == 400
    assert no_max.json()["type"] == "error" and no_max.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in no_max.json()["error"]["message"]
    refused = {
        "temperature": {"temperature": 1.5},
        "unknown_field": {"unknown_field": 1},
        "web_search": {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        "cannot see images": {"messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": (  # a real 1x1 PNG
                "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC")}}]}]},
        "tool_choice": {"tool_choice": {"type": "any"}},
    }
    for named, body in refused.items():
        response = httpx.post(f"{server}/v1/messages", json={"model": MODEL, "max_tokens": 5, "messages": HELLO, **body})
        assert response.status_code == 400, (named, response.text)
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and named in error["message"], (named, error)
    with pytest.raises(anthropic.BadRequestError):
        client.messages.count_tokens(model=MODEL, messages=[])


# --- the window, on a stand-in with a small one -----------------------------------------------------------
def test_max_tokens_above_the_window_is_capped_to_what_it_leaves(small_standin_server):
    small = anthropic_client(small_standin_server)
    filler = " ".join(["apple"] * 40)
    long_question = [{"role": "user", "content": f"{filler}\nRepeat the word apple many times."}]
    prompt = small.messages.count_tokens(model=MODEL, messages=long_question).input_tokens
    room = SMALL_WINDOW - prompt
    assert 0 < room < 480
    message = small.messages.create(model=MODEL, max_tokens=32000, messages=long_question, extra_body=GREEDY)
    assert message.usage.input_tokens == prompt and message.usage.output_tokens <= room
    if message.usage.output_tokens == room:
        assert message.stop_reason == "max_tokens"
    nearly_full = [{"role": "user", "content": "Tell me a long story about a dragon."},
                   {"role": "assistant", "content": "Once upon a time, a dragon flew over the hills. " * 7
                    + "It landed."}]  # the stand-in's tokens are bytes: this leaves 33
    tight = small.messages.create(model=MODEL, max_tokens=32000, messages=nearly_full, extra_body=GREEDY)
    left = SMALL_WINDOW - tight.usage.input_tokens
    assert 0 < left < 40
    assert tight.usage.output_tokens == left and tight.stop_reason == "max_tokens"


def test_a_conversation_longer_than_the_window_is_a_400_with_the_counts(small_standin_server):
    turns = [{"role": r, "content": "word " * 150} for r in ("user", "assistant") * 3] + HELLO
    response = httpx.post(f"{small_standin_server}/v1/messages", json={"model": MODEL, "max_tokens": 10, "messages": turns},
                          timeout=120)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and str(SMALL_WINDOW) in error["message"]
    assert "tokens" in error["message"]


# --- the same rules as every route ----------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_a_hostile_host_or_a_cross_site_post_is_refused_and_generates_nothing(server, engine, path):
    before = engine.metrics.snapshot()[MODEL].requests
    body = {"model": MODEL, "max_tokens": 2, "messages": HELLO}
    attempts = {421: {"Host": "evil.example", "Origin": "http://evil.example"},
                403: {"Origin": "http://evil.example"}}
    for status, headers in attempts.items():
        response = httpx.post(f"{server}{path}", json=body, headers=headers, timeout=60)
        assert response.status_code == status, response.text
        assert response.json()["type"] == "error" and response.json()["error"]["message"]
    cross = httpx.post(f"{server}{path}", json=body, headers={"Sec-Fetch-Site": "cross-site"}, timeout=60)
    assert cross.status_code == 403 and cross.json()["error"]["type"] == "permission_error"
    assert engine.metrics.snapshot()[MODEL].requests == before


def test_with_accounts_on_an_x_api_key_is_needed_and_enough(settings, engine, tmp_path_factory):
    import anthropic

    own = Settings(data_dir=tmp_path_factory.mktemp("anthropic-accounts"), models_dir=settings.models_dir,
                   torch_threads=settings.torch_threads)
    add_user(own.data_dir, "carol")
    key = serge(own.data_dir, "keys", "create", "carol", "--name", "claude code").strip().splitlines()[-1]
    assert key.startswith("sk-serge-")
    remote = {"X-Forwarded-For": "203.0.113.9"}  # not this machine, which needs no key while no account exists
    with ServerThread(build_app(own, engine), held_port()) as running:
        keyed = anthropic_client(running.url, api_key=key, timeout=120, default_headers=remote)
        assert keyed.messages.create(model=MODEL, max_tokens=2, messages=HELLO).content[0].type == "text"
        assert keyed.messages.count_tokens(model=MODEL, messages=HELLO).input_tokens > 0
        bearer = anthropic_client(running.url, api_key=None, auth_token=key, timeout=120, default_headers=remote)
        assert bearer.messages.count_tokens(model=MODEL, messages=HELLO).input_tokens > 0
        for headers in ({}, {"x-api-key": "sk-serge-not-a-key"}):
            response = httpx.post(f"{running.url}/v1/messages", headers={**remote, **headers}, timeout=60,
                                  json={"model": MODEL, "max_tokens": 2, "messages": HELLO})
            assert response.status_code == 401, response.text
            assert response.json()["type"] == "error"
            assert response.json()["error"]["type"] == "authentication_error"
        with pytest.raises(anthropic.AuthenticationError):
            anthropic_client(running.url, api_key="sk-serge-wrong",
                             default_headers=remote).messages.count_tokens(model=MODEL, messages=HELLO)
        chats = httpx.get(f"{running.url}/api/chats", headers={**remote, "x-api-key": key}, timeout=60)
        assert chats.status_code == 200, "x-api-key is a key on every API route"
