"""A schema that compiles but cannot be matched in bounded size is a 400 naming the field, never a 500.

Each probe from issue 18 goes through the real HTTP server, as a `response_format` and as a
tool's parameters; none may answer 500, hang, or leave the server unable to answer the next.
"""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.real_model  # the real model on a real server: the product's own promises

PROBES = {
    "required recursive $ref": {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
    "$ref to the root": {"$ref": "#"},
    "recursion behind a free string": {"type": "object", "properties": {"b": {"type": "string"}, "a": {"$ref": "#"}},
                                       "required": ["b", "a"]},
    "recursion through $defs": {"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}},
                                                "required": ["next"]}}, "$ref": "#/$defs/n"},
    "a million-fold pattern": {"type": "string", "pattern": "^a{1000000}$"},
}
FINE = {  # recursion with a way out, and a long but bounded pattern, still compile
    "optional recursion": {"type": "object", "properties": {"a": {"$ref": "#"}}},
    "recursion or null": {"type": "object", "properties": {"a": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
                          "required": ["a"]},
    "a bounded pattern": {"type": "string", "pattern": "^a{20}$"},
}
HI = [{"role": "user", "content": "Hi"}]


def ask(server: str, **body) -> httpx.Response:
    return httpx.post(f"{server}/v1/chat/completions", json={"messages": HI, "max_tokens": 8, **body}, timeout=60)


def as_format(schema: dict) -> dict:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "probe", "schema": schema}}}


def as_tool(schema: dict, choice="required") -> dict:
    return {"tools": [{"type": "function", "function": {"name": "probe", "parameters": schema}}],
            "tool_choice": choice}


@pytest.mark.parametrize("probe", PROBES)
def test_a_schema_that_cannot_be_bounded_is_a_400_naming_response_format(server, probe):
    answer = ask(server, **as_format(PROBES[probe]))
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "response_format" and error["message"].startswith("response_format:")
    assert "simplify" in error["message"] or "recursion optional" in error["message"], error["message"]


@pytest.mark.parametrize("probe", PROBES)
def test_a_tool_schema_that_cannot_be_bounded_is_a_400_naming_tools(server, probe):
    answer = ask(server, **as_tool(PROBES[probe]))
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "tools" and error["message"].startswith("tools:"), error
    auto = ask(server, **as_tool(PROBES[probe], "auto"))  # unconstrained unless a call starts: never a 500
    assert auto.status_code in (200, 400), auto.text


@pytest.mark.parametrize("schema", FINE)
def test_schemas_with_a_way_out_still_generate(server, schema):
    answer = ask(server, **as_format(FINE[schema]))
    assert answer.status_code == 200, answer.text
    called = ask(server, **{**as_tool(FINE[schema]), "max_tokens": 64})  # a forced call's wrapper needs more than 8
    assert called.status_code == 200, called.text
