"""A reply constrained by a schema is complete within its budget: near max_tokens it is steered to close
what is open, so it parses and validates even when cut; finish_reason still says length when it is."""

from __future__ import annotations

import json

import pytest

from serge.engine import ChatRequest, FinishReason, Message, ResponseFormat, SamplingParams, Tool, Tools

from conftest import MODEL

pytestmark = pytest.mark.real_model  # the real model on a real server: the product's own promises

CITY = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
        "required": ["city", "population"]}
ASK = [Message("user", "Describe a big city as JSON with its name and population.")]


@pytest.fixture(scope="module")
def engine(both_engines):
    return both_engines


@pytest.mark.parametrize("budget", [30])
def test_a_schema_reply_at_temperature_one_parses_for_every_seed(engine, budget):
    fmt = ResponseFormat.model_validate({"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}})
    streams = [engine.chat(MODEL, ChatRequest(ASK, SamplingParams(temperature=1, max_new_tokens=budget, seed=seed),
                                              response_format=fmt)) for seed in range(20)]
    for seed, stream in enumerate(streams):
        text = stream.text()
        reply = json.loads(text)  # raises for a cut reply
        assert isinstance(reply["city"], str) and isinstance(reply["population"], int), (seed, text)
        assert stream.record.completion_tokens <= budget
        assert stream.record.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)


def test_a_required_tool_call_is_complete_within_a_tight_budget(engine):
    tool = Tool("describe_city", "Record a city.", json.dumps(CITY))
    streams = [engine.chat(MODEL, ChatRequest(ASK, SamplingParams(temperature=1, max_new_tokens=40, seed=seed),
                                              Tools((tool,), "required"))) for seed in range(8)]
    for stream in streams:
        stream.text()
        [call] = stream.record.tool_calls
        arguments = json.loads(call.arguments)
        assert isinstance(arguments["city"], str) and isinstance(arguments["population"], int), call.arguments
