"""One rule for budgets: a reply budget below what the shortest reply a JSON schema or a forced tool call allows
takes is the same clear 400 on every dialect, in the dialect's own error shape and naming the budget by the
dialect's own name (max_tokens, num_predict, max_output_tokens) and the least that fits; at that least the
reply is answered and parses. Never a cut, invalid JSON with done_reason length. On the stand-in model."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from conftest import server_of_its_own
from standin import NAME as MODEL, stand_in

settings, engine = stand_in("settings", "engine")
server = server_of_its_own()

OWNER = {"type": "object", "properties": {"steps": {"type": "array", "items": {"type": "string"}},
                                          "owner": {"type": "object", "properties": {
                                              "name": {"type": "string"}, "age": {"type": "integer"}},
                                              "required": ["name", "age"]}},
         "required": ["steps", "owner"]}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
ASK = [{"role": "user", "content": "Make a plan as JSON."}]
SHORT = 5


def least_of(message: str, name: str) -> int:
    """The least budget a refusal names; it must name the budget by `name`."""
    found = re.fullmatch(rf"{name}={SHORT} is fewer than the (\d+) tokens the shortest reply this (schema|tool call) "
                         r"allows takes; ask for at least \1", message)
    assert found, message
    return int(found[1])


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=120)


def test_ollama_chat_format_below_the_least_is_a_400_in_ollamas_shape(server):
    body = {"model": MODEL, "messages": ASK, "format": OWNER, "stream": False}
    for stream in (False, True):
        short = post(server, "/api/chat", {**body, "stream": stream, "options": {"num_predict": SHORT}})
        assert short.status_code == 400 and set(short.json()) == {"error"}, short.text
        least = least_of(short.json()["error"], "num_predict")
    enough = post(server, "/api/chat", {**body, "options": {"num_predict": least, "temperature": 0}})
    assert enough.status_code == 200, enough.text
    assert set(json.loads(enough.json()["message"]["content"])) == {"steps", "owner"}


def test_ollama_generate_format_json_below_the_least_is_a_400(server):
    short = post(server, "/api/generate", {"model": MODEL, "prompt": "A plan as JSON.", "format": OWNER,
                                           "stream": False, "options": {"num_predict": SHORT}})
    assert short.status_code == 400, short.text
    least_of(short.json()["error"], "num_predict")


@pytest.mark.parametrize("forced", [{"tool_choice": {"type": "tool", "name": "get_weather"}},
                                    {"tool_choice": {"type": "any"}},
                                    {"output_config": {"format": {"type": "json_schema", "schema": OWNER}}}])
def test_anthropic_forced_tool_or_format_below_the_least_is_a_400_in_anthropics_shape(server, forced):
    tools = {"tools": [{"name": "get_weather", "input_schema": WEATHER}]} if "tool_choice" in forced else {}
    body = {"model": MODEL, "messages": ASK, **tools, **forced}
    short = post(server, "/v1/messages", {**body, "max_tokens": SHORT})
    assert short.status_code == 400, short.text
    error = short.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error", error
    least = least_of(error["error"]["message"], "max_tokens")
    enough = post(server, "/v1/messages", {**body, "max_tokens": least, "temperature": 0})
    assert enough.status_code == 200, enough.text
    block = enough.json()["content"][-1]
    assert block["type"] == "tool_use" if tools else json.loads(block["text"]), block


def test_openai_and_responses_refuse_alike_naming_their_own_budget(server):
    chat = post(server, "/v1/chat/completions", {
        "model": MODEL, "messages": ASK, "max_tokens": SHORT,
        "response_format": {"type": "json_schema", "json_schema": {"name": "plan", "schema": OWNER}}})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "max_tokens", chat.text
    least = least_of(chat.json()["error"]["message"], "max_tokens")
    response = post(server, "/v1/responses", {
        "model": MODEL, "input": ASK, "max_output_tokens": SHORT,
        "text": {"format": {"type": "json_schema", "name": "plan", "schema": OWNER}}})
    assert response.status_code == 400 and response.json()["error"]["param"] == "max_output_tokens", response.text
    assert least_of(response.json()["error"]["message"], "max_output_tokens") == least
