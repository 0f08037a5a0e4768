"""A reply under a schema closes within any budget at or above its grammar's distance to an end: steering begins when
the tokens left reach that distance (walked on the grammar each token, not a fixed count), so a nested schema's
reply parses and validates at every max_tokens from there up, for every seed at temperature 1.

On the stand-in (its grammars and steering are the product's; it writes a little JSON as a model would, at
temperature 1 all over the place) through the engine's door, each budget's seeds as one request's choices.
"""

from __future__ import annotations

import json
import time

import pytest
from standin import NAME as MODEL, stand_in

from serge.engine import ChatRequest, FinishReason, Message, ResponseFormat, SamplingParams
from serge.engine.generation.constraints.schemas import json_rule

settings, engine = stand_in("settings", "engine")

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
PLAN = {"type": "object", "properties": {"title": {"type": "string"}, "owners": {"type": "array", "items": PERSON},
                                         "owner": PERSON, "steps": {"type": "array", "items": {"type": "string"}}},
        "required": ["title", "owners", "owner", "steps"]}
ASK = [Message("user", "Make a plan as JSON.")]
FORMAT = ResponseFormat.model_validate({"type": "json_schema", "json_schema": {"name": "plan", "schema": PLAN}})
SEEDS = 20


def valid(reply: dict) -> bool:
    person = lambda p: isinstance(p, dict) and isinstance(p["name"], str) and isinstance(p["age"], int)  # noqa: E731
    return (isinstance(reply["title"], str) and all(person(p) for p in reply["owners"]) and person(reply["owner"])
            and all(isinstance(s, str) for s in reply["steps"]))


@pytest.fixture(scope="module")
def closing_distance(engine) -> int:
    vocabulary = engine.model(MODEL).scheduler.vocabulary
    matcher = vocabulary.matcher("start: " + json_rule(PLAN), "response_format")
    return matcher.distance(vocabulary.closers(), 1000)


def test_the_distance_is_what_the_shortest_valid_reply_takes(closing_distance):
    shortest = '{"title": "", "owners": [], "owner": {"name": "", "age": 0}, "steps": []}'
    assert closing_distance == len(shortest)  # the stand-in's tokens are bytes


def test_an_optional_recursion_is_closed_not_followed(engine):
    vocabulary = engine.model(MODEL).scheduler.vocabulary
    recursive = {"type": "object", "properties": {"a": {"$ref": "#"}, "b": {"type": "array"}}}
    matcher = vocabulary.matcher("start: " + json_rule(recursive), "response_format")
    assert matcher.distance(vocabulary.closers(), 100) == len("{}")


def test_a_nested_schema_cut_at_every_budget_from_its_distance_parses_and_validates(engine, closing_distance):
    started = time.monotonic()
    for budget in range(closing_distance, 129):
        streams = [engine.chat(MODEL, ChatRequest(ASK, SamplingParams(temperature=1, max_new_tokens=budget,
                                                                      seed=budget * 100 + half * SEEDS // 2),
                                                  response_format=FORMAT, n=SEEDS // 2)) for half in range(2)]
        texts, records = [], []
        for stream in streams:  # the stand-in runs 16 at once: 20 seeds as two requests of 10 choices
            mine = [""] * (SEEDS // 2)
            for delta in stream.deltas():
                mine[delta.choice] += delta.text
            texts += mine
            records += stream.records
        for choice, (text, record) in enumerate(zip(texts, records)):
            assert record.completion_tokens <= budget
            assert record.finish_reason in (FinishReason.STOP, FinishReason.LENGTH), record
            try:
                reply = json.loads(text)
            except ValueError:
                pytest.fail(f"max_tokens={budget}, choice {choice}: the reply does not parse: {text!r}")
            assert valid(reply), (budget, choice, text)
    print(f"{129 - closing_distance} budgets x {SEEDS} seeds in {time.monotonic() - started:.0f} s")


def test_a_max_tokens_below_the_distance_is_a_400_naming_the_least_that_fits(standin_server, closing_distance):
    import httpx

    body = {"model": MODEL, "messages": [{"role": "user", "content": "Make a plan as JSON."}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "plan", "schema": PLAN}}}
    short = httpx.post(f"{standin_server}/v1/chat/completions", json={**body, "max_tokens": closing_distance - 1},
                       timeout=60)
    assert short.status_code == 400, short.text
    error = short.json()["error"]
    assert error["param"] == "max_tokens" and f"at least {closing_distance}" in error["message"], error
    enough = httpx.post(f"{standin_server}/v1/chat/completions", json={**body, "max_tokens": closing_distance},
                        timeout=60)
    assert enough.status_code == 200 and valid(json.loads(enough.json()["choices"][0]["message"]["content"]))


def test_on_responses_the_400_names_max_output_tokens(standin_server, closing_distance):
    import httpx

    short = httpx.post(f"{standin_server}/v1/responses", timeout=60, json={
        "model": MODEL, "input": "Make a plan as JSON.", "max_output_tokens": closing_distance - 1,
        "text": {"format": {"type": "json_schema", "name": "plan", "schema": PLAN}}})
    assert short.status_code == 400, short.text
    error = short.json()["error"]
    assert error["param"] == "max_output_tokens" and f"max_output_tokens={closing_distance - 1}" in error["message"]


def test_a_schema_the_closing_walk_cannot_end_is_not_refused(standin_server):
    """The walk is greedy: for ^(a|aa)+b$ it writes a's for ever. Finding no end is no proof that none fits,
    so such a request runs (the shortest valid reply, "ab", takes a few tokens) rather than being a 400."""
    import httpx

    schema = {"type": "string", "pattern": "^(a|aa)+b$"}
    answer = httpx.post(f"{standin_server}/v1/chat/completions", timeout=120, json={
        "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 40,
        "response_format": {"type": "json_schema", "json_schema": {"name": "ab", "schema": schema}}})
    assert answer.status_code == 200, answer.text
