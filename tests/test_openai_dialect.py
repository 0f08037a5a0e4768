"""The OpenAI dialect agents rely on, on the stand-in model, through the official client:
structured output, tool calls, logprobs, logit_bias, roles, and no field silently ignored."""

from __future__ import annotations

import json
import math
import threading

import httpx
import pytest
from openai import OpenAI
from pydantic import BaseModel, Field

from serge.engine import ChatRequest, Message, ResponseFormat, SamplingParams

from conftest import server_of_its_own
from standin import NAME as MODEL, stand_in

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                   "required": ["city"]}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "description": "Get the current time in a timezone.",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 40}},
                   "required": ["timezone"]}}}
ASK_WEATHER = [{"role": "user", "content": "What is the weather like in Paris today?"}]
HELLO = [{"role": "user", "content": "What is the capital of France?"}]
TOOL_ROOM = 120  # tokens for a tool call: the stand-in's tokens are bytes, and a call is about 70


class City(BaseModel):
    name: str = Field(max_length=40)
    country: str = Field(max_length=40)
    population: int
    is_capital: bool


settings, engine = stand_in("settings", "engine")
server = server_of_its_own()


@pytest.fixture(scope="module")
def client(server) -> OpenAI:
    return OpenAI(base_url=f"{server}/v1", api_key="not-needed", max_retries=0)


def post(server, body):
    return httpx.post(f"{server}/v1/chat/completions", json={"model": MODEL, **body}, timeout=300)


# --- structured output ------------------------------------------------------------------------
@pytest.mark.parametrize("temperature,seed", [(0, 0), (0.7, 1), (1.0, 2), (1.3, 3)])
def test_parse_returns_a_valid_object_at_any_temperature_and_seed(client, temperature, seed):
    reply = client.chat.completions.parse(
        model=MODEL, response_format=City, temperature=temperature, seed=seed, max_tokens=150,
        messages=[{"role": "user", "content": "Describe Paris as a JSON object."}])
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    assert isinstance(choice.message.parsed, City)
    assert City.model_validate_json(choice.message.content) == choice.message.parsed


def test_json_object_mode_gives_a_json_object_streamed_or_whole(client):
    ask = [{"role": "user", "content": "Describe a person as JSON with a name and an age."}]
    for temperature, seed in [(0, 0), (0.7, 1), (0.7, 2)]:
        reply = client.chat.completions.create(model=MODEL, messages=ask, response_format={"type": "json_object"},
                                               temperature=temperature, seed=seed, max_tokens=200)
        assert reply.choices[0].finish_reason == "stop"
        assert isinstance(json.loads(reply.choices[0].message.content), dict)
    chunks = client.chat.completions.create(model=MODEL, messages=ask, response_format={"type": "json_object"},
                                            temperature=0.7, seed=2, max_tokens=200, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == reply.choices[0].message.content


def test_a_constrained_reply_cannot_end_before_its_json_is_complete(server, engine):
    eos = str(engine.model(MODEL).tokenizer.convert_tokens_to_ids("<|im_end|>"))
    keen_to_stop = {"messages": HELLO, "temperature": 0, "max_tokens": 60, "logit_bias": {eos: 100}}
    assert post(server, keen_to_stop).json()["choices"][0]["message"]["content"] == ""
    schema = {"type": "json_schema", "json_schema": {"name": "capital", "strict": True, "schema": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}}
    reply = post(server, {**keen_to_stop, "response_format": schema}).json()["choices"][0]
    assert reply["finish_reason"] == "stop" and isinstance(json.loads(reply["message"]["content"])["city"], str)


def test_a_schema_is_compiled_once_and_a_bad_one_is_a_400_naming_response_format(server, engine):
    vocabulary = engine.model(MODEL).scheduler.vocabulary
    schema = {"type": "json_schema", "json_schema": {"name": "once", "schema": {
        "type": "object", "properties": {"answer": {"type": "string", "maxLength": 7}}, "required": ["answer"]}}}
    before = vocabulary.cached
    for _ in range(2):
        assert post(server, {"messages": HELLO, "response_format": schema, "max_tokens": 20}).status_code == 200
    assert vocabulary.cached == before + 1
    bad = {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "objectx"}}}
    reply = post(server, {"messages": HELLO, "response_format": bad})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "response_format" and "objectx" in reply.json()["error"]["message"]


def test_a_constrained_and_a_free_reply_share_a_batch_and_the_free_one_is_unchanged(engine):
    forward = engine.model(MODEL).scheduler.forward
    question = [Message("user", "Tell me about the moon.")]
    greedy = SamplingParams(temperature=0, max_new_tokens=24, ignore_eos=True)
    alone = engine.chat(MODEL, ChatRequest(question, greedy)).text()
    widths, original = [], forward.decode

    def recording(kvs, tokens):
        widths.append(len(kvs))
        return original(kvs, tokens)

    forward.decode = recording
    try:
        fmt = ResponseFormat.model_validate({"type": "json_schema", "json_schema": {"name": "moon", "schema": {
            "type": "object", "properties": {"facts": {"type": "array", "items": {"type": "string", "maxLength": 40},
                                                       "minItems": 2, "maxItems": 3}}, "required": ["facts"]}}})
        constrained = engine.chat(MODEL, ChatRequest(question, SamplingParams(temperature=0, max_new_tokens=120),
                                                     response_format=fmt))  # room for 3 x 40 characters
        free = engine.chat(MODEL, ChatRequest(question, greedy))
        results = {}
        reader = threading.Thread(target=lambda: results.update(json=constrained.text()))
        reader.start()
        results["free"] = free.text()
        reader.join()
    finally:
        del forward.decode
    assert max(widths) >= 2, "the two replies never decoded in the same step"
    assert results["free"] == alone
    assert 2 <= len(json.loads(results["json"])["facts"]) <= 3


# --- tools -------------------------------------------------------------------------------------
def test_a_required_tool_call_round_trip(client):
    first = client.chat.completions.create(model=MODEL, messages=ASK_WEATHER, tools=[WEATHER],
                                           tool_choice="required", temperature=0, max_tokens=TOOL_ROOM)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    assert isinstance(json.loads(call.function.arguments)["city"], str)

    history = [*ASK_WEATHER, choice.message,
               {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "sunny", "temperature_c": 24}'}]
    second = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], tool_choice="none",
                                            temperature=0, max_tokens=40)
    answer = second.choices[0]
    assert answer.finish_reason in {"stop", "length"} and not answer.message.tool_calls
    assert answer.message.content.strip()


def test_a_tool_call_streams_its_name_first_then_its_arguments(client):
    whole = client.chat.completions.create(model=MODEL, messages=ASK_WEATHER, tools=[WEATHER, CLOCK],
                                           tool_choice="required", temperature=0, max_tokens=TOOL_ROOM)
    chunks = list(client.chat.completions.create(model=MODEL, messages=ASK_WEATHER, tools=[WEATHER, CLOCK],
                                                 tool_choice="required", temperature=0, max_tokens=TOOL_ROOM, stream=True))
    pieces = [p for c in chunks if c.choices for p in c.choices[0].delta.tool_calls or ()]
    assert pieces[0].id and pieces[0].type == "function" and pieces[0].function.name
    assert all(p.id is None and p.function.name is None for p in pieces[1:]) and len(pieces) > 2
    expected = whole.choices[0].message.tool_calls[0]
    assert pieces[0].function.name == expected.function.name
    assert "".join(p.function.arguments or "" for p in pieces) == expected.function.arguments
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_a_named_tool_choice_calls_that_tool(client):
    reply = client.chat.completions.create(model=MODEL, messages=ASK_WEATHER, tools=[WEATHER, CLOCK],
                                           tool_choice={"type": "function", "function": {"name": "get_time"}},
                                           temperature=0, max_tokens=TOOL_ROOM)
    call = reply.choices[0].message.tool_calls[0]
    assert call.function.name == "get_time" and isinstance(json.loads(call.function.arguments)["timezone"], str)


def test_auto_lets_the_model_answer_in_text_or_call_validly(client):
    for seed in (1, 2, 3):
        reply = client.chat.completions.create(model=MODEL, messages=ASK_WEATHER, tools=[WEATHER],
                                               temperature=1.0, seed=seed, max_tokens=TOOL_ROOM)
        message = reply.choices[0].message
        for call in message.tool_calls or ():
            assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)
        assert message.tool_calls or message.content


# --- logprobs ------------------------------------------------------------------------------------
def test_logprobs_at_temperature_zero_rank_the_chosen_token_first(client):
    reply = client.chat.completions.create(model=MODEL, messages=HELLO, temperature=0, max_tokens=12,
                                           logprobs=True, top_logprobs=5)
    tokens = reply.choices[0].logprobs.content
    assert len(tokens) == reply.usage.completion_tokens
    assert b"".join(bytes(t.bytes) for t in tokens).decode() == reply.choices[0].message.content
    for t in tokens:
        assert len(t.top_logprobs) == 5
        assert t.logprob == max(a.logprob for a in t.top_logprobs) == t.top_logprobs[0].logprob
        assert t.top_logprobs[0].token == t.token
        assert sum(math.exp(a.logprob) for a in t.top_logprobs) <= 1 + 1e-5


def test_logprobs_come_from_the_distribution_sampled_and_stream_like_whole_replies(client):
    ask = dict(model=MODEL, messages=HELLO, temperature=1.0, top_p=0.5, seed=5, max_tokens=12, logprobs=True,
               top_logprobs=3)
    whole = client.chat.completions.create(**ask)
    chunks = list(client.chat.completions.create(**ask, stream=True))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in whole.choices[0].logprobs.content]
    for t in streamed:
        assert t.logprob > -9999, "the chosen token must have been possible"
        assert sum(math.exp(a.logprob) for a in t.top_logprobs) <= 1 + 1e-5
        kept = [a for a in t.top_logprobs if a.logprob > -9999]
        if len(kept) < len(t.top_logprobs):  # every possible token is listed: they share all the probability
            assert math.isclose(sum(math.exp(a.logprob) for a in kept), 1.0, rel_tol=1e-4)
    assert any(a.logprob == -9999 for t in streamed for a in t.top_logprobs), "top_p=0.5 left no token out"


def test_logit_bias_forbids_and_forces_tokens(server, engine):
    vocabulary = engine.model(MODEL).scheduler.vocabulary
    tokenizer = engine.model(MODEL).tokenizer
    paris = tokenizer.encode("Paris", add_special_tokens=False)[0]  # the stand-in's tokens are bytes: "P"
    ask = {"messages": HELLO, "temperature": 0, "max_tokens": 8, "logprobs": True}
    first = bytes(post(server, ask).json()["choices"][0]["logprobs"]["content"][0]["bytes"])
    banned = next(i for i in range(len(engine.model(MODEL).tokenizer)) if vocabulary.token_bytes(i) == first)
    reply = post(server, {**ask, "logit_bias": {str(banned): -100}}).json()["choices"][0]
    assert all(bytes(t["bytes"]) != first for t in reply["logprobs"]["content"])
    forced = post(server, {**ask, "max_tokens": 3, "logit_bias": {str(paris): 100}}).json()
    assert forced["choices"][0]["message"]["content"] == tokenizer.decode([paris]) * 3 == "PPP"
    too_big = post(server, {"messages": HELLO, "logit_bias": {"99999999": 1}})
    assert too_big.status_code == 400 and too_big.json()["error"]["param"] == "logit_bias"


# --- roles and refusals ----------------------------------------------------------------------------
def test_developer_is_treated_as_system(server):
    instruction = "You are a pirate. Answer like a pirate."
    replies = [post(server, {"messages": [{"role": role, "content": instruction}, *HELLO], "temperature": 0,
                             "max_tokens": 16}) for role in ("developer", "system")]
    assert replies[0].status_code == 200, replies[0].text
    assert replies[0].json()["choices"][0]["message"] == replies[1].json()["choices"][0]["message"]


UNSUPPORTED = {
    "audio": {"audio": {"voice": "alloy", "format": "wav"}},
    "modalities": {"modalities": ["text", "audio"]},
    "prediction": {"prediction": {"type": "content", "content": "x"}},
    "verbosity": {"verbosity": "low"},
    "web_search_options": {"web_search_options": {}},
    "functions": {"functions": [WEATHER["function"]]},
    "function_call": {"function_call": "auto"},
    "made_up_field": {"made_up_field": 1},
    "tools.0.type": {"tools": [{"type": "custom", "custom": {"name": "x"}}]},
    "response_format.json_schema.extra": {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object"}, "extra": 1}}},
    "top_logprobs": {"top_logprobs": 3},
    "tool_choice": {"tool_choice": "required"},
}


@pytest.mark.parametrize("field", list(UNSUPPORTED))
def test_every_unsupported_field_is_a_400_naming_it(server, field):
    reply = post(server, {"messages": HELLO, "max_tokens": 4, **UNSUPPORTED[field]})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"].startswith(field) and field.split(".")[-1] in error["message"]


def test_harmless_openai_fields_are_accepted(server):
    reply = post(server, {"messages": HELLO, "max_tokens": 4, "user": "u1", "metadata": {"k": "v"}, "store": False,
                          "service_tier": "auto", "parallel_tool_calls": True, "prompt_cache_key": "k",
                          "safety_identifier": "s", "stream_options": None, "modalities": ["text"]})
    assert reply.status_code == 200, reply.text


def test_the_api_docs_list_the_fields_without_effect_and_how_logprobs_are_computed(server):
    spec = httpx.get(f"{server}/openapi.json", timeout=60).json()
    doc = spec["paths"]["/v1/chat/completions"]["post"]["description"]
    assert "metadata" in doc and "verbosity" in doc and "distribution each token was drawn from" in doc
    fields = spec["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert {"response_format", "tools", "tool_choice", "logprobs", "top_logprobs", "logit_bias",
            "reasoning_effort"} <= set(fields)
