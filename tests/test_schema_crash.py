"""No schema, grammar option or body takes the server down: what would crash llguidance is a 400 naming the field.

A flat chain of 2,500 `$ref`s made llguidance overflow its stack (SIGSEGV) and ended the
whole process, on every dialect that takes a schema. These send it through a real server
over the stand-in model (whose grammars are the product's own, on a real tokenizer), with a
reply streaming beside it that must still finish; then past the depth limit (raised for the
test) to show the child process takes the crash instead; then a bounded fuzz of deep and
wide schemas, after which the server still answers.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
from conftest import server_of_its_own
from hypothesis import HealthCheck, Phase, given, settings as hsettings, strategies as st
from standin import NAME as MODEL, stand_in

from serge.engine.generation.constraints import schemas
from serge.engine.generation.constraints.grammar_check import GrammarCheck

settings, engine = stand_in("settings", "engine")
server = server_of_its_own()


def chain(links: int) -> dict:
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(links)}
    defs[f"d{links}"] = {"type": "string"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


HI = [{"role": "user", "content": "Hi"}]


def chat(schema):
    return "/v1/chat/completions", {"model": MODEL, "messages": HI, "max_tokens": 8, "response_format": {
        "type": "json_schema", "json_schema": {"name": "probe", "schema": schema}}}, "response_format"


def ollama(schema):
    return "/api/chat", {"model": MODEL, "messages": HI, "stream": False, "options": {"num_predict": 8},
                         "format": schema}, "format"


def responses(schema):
    return "/v1/responses", {"model": MODEL, "input": "Hi", "max_output_tokens": 16, "text": {
        "format": {"type": "json_schema", "name": "probe", "schema": schema}}}, "text.format"


def messages(schema):
    return "/v1/messages", {"model": MODEL, "messages": HI, "max_tokens": 8,
                            "output_config": {"format": {"type": "json_schema", "schema": schema}}}, "output_config"


def tool(schema):
    return "/v1/chat/completions", {"model": MODEL, "messages": HI, "max_tokens": 8, "tool_choice": "required",
                                    "tools": [{"type": "function", "function": {"name": "probe",
                                                                                "parameters": schema}}]}, "tools"


DIALECTS = {"chat completions": chat, "ollama": ollama, "responses": responses, "messages": messages, "tool": tool}


def message_of(answer: httpx.Response) -> str:
    body = answer.json()
    error = body.get("error")
    return error if isinstance(error, str) else json.dumps(error)


def refused(server: str, made, why: str) -> None:
    path, body, field = made
    answer = httpx.post(server + path, json=body, timeout=60)
    assert answer.status_code == 400, answer.text
    assert why in message_of(answer), answer.text
    assert httpx.get(f"{server}/api/health", timeout=10).status_code == 200


def long_reply(server: str):
    """A streamed reply the stand-in goes on writing until its budget, begun and left open."""
    request = httpx.stream("POST", f"{server}/v1/chat/completions", timeout=120, json={
        "model": MODEL, "stream": True, "max_tokens": 2000,
        "messages": [{"role": "user", "content": "Write something long"}]})
    response = request.__enter__()
    lines = response.iter_lines()
    assert next(line for line in lines if line.startswith("data:"))
    return request, lines


def finishes(request, lines) -> str:
    try:
        reasons = [json.loads(line[5:])["choices"][0].get("finish_reason") for line in lines
                   if line.startswith("data:") and line != "data: [DONE]"]
    finally:
        request.__exit__(None, None, None)
    return [r for r in reasons if r][-1]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_chain_of_2500_refs_is_a_400_and_a_reply_beside_it_finishes(server, dialect):
    request, lines = long_reply(server)
    refused(server, DIALECTS[dialect](chain(2500)), "levels deep")
    assert finishes(request, lines) == "length"


def test_past_the_depth_limit_the_crash_happens_in_a_child_and_is_a_400(server, monkeypatch):
    monkeypatch.setattr(schemas, "schema_problem", lambda schema: None)  # as if the bounds missed a case
    request, lines = long_reply(server)
    for dialect in ("chat completions", "ollama"):
        refused(server, DIALECTS[dialect](chain(2500 + len(dialect))), "crashed the process that tried (SIGSEGV)")
    assert finishes(request, lines) == "length"


def test_a_grammar_that_killed_a_child_is_refused_again_without_another(monkeypatch):
    check = GrammarCheck()
    grammar = "start: %json " + json.dumps(chain(2500))
    assert "SIGSEGV" in check.problem(grammar)
    monkeypatch.setattr(check, "_run", lambda grammar: pytest.fail("checked twice"))
    assert "SIGSEGV" in check.problem(grammar)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_schema_with_no_finite_instance_is_a_400(server, dialect):
    endless = {"type": "object", "additionalProperties": {"$ref": "#"}, "minProperties": 1}
    refused(server, DIALECTS[dialect](endless), "no finite JSON matches")


@pytest.mark.parametrize("options", [{"whitespace_pattern": "a{1000000}"}, {"whitespace_pattern": "x" * 1000},
                                     {"max_tokens": 5}, "flexible"])
def test_client_grammar_options_out_of_bounds_are_a_400_naming_them(server, options):
    refused(server, chat({"type": "object", "x-guidance": options}), "x-guidance")


def test_bounded_client_grammar_options_are_taken(server):
    path, body, _ = chat({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                          "x-guidance": {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}})
    answer = httpx.post(server + path, json={**body, "max_tokens": 32}, timeout=60)
    assert answer.status_code == 200, answer.text
    assert json.loads(answer.json()["choices"][0]["message"]["content"]).keys() == {"a"}


def nested(depth: int, width: int, kind: str) -> dict:
    """A schema `depth` levels deep and `width` wide, by objects, arrays, anyOf or $ref chains (900 levels at
    most: deeper, the client cannot encode it, and the server refuses the body as nested too deeply)."""
    if kind == "refs":
        defs = {f"d{i}": {"type": "object", "properties": {f"p{j}": {"$ref": f"#/$defs/d{i + 1}"}
                                                           for j in range(width)}} for i in range(depth)}
        defs[f"d{depth}"] = {"type": "string"}
        return {"$defs": defs, "$ref": "#/$defs/d0"}
    schema: dict = {"type": "string"}
    for _ in range(depth):
        if kind == "objects":
            schema = {"type": "object", "properties": {f"p{j}": schema for j in range(width)}}
        elif kind == "arrays":
            schema = {"type": "array", "items": schema, "maxItems": width}
        else:
            schema = {"anyOf": [schema] * width}
    return schema


DEADLINE = time.monotonic() + 1e9  # set when the fuzz starts


@hsettings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
           phases=[Phase.explicit, Phase.generate])  # no shrinking: each example is a request; the failure says it
@given(depth=st.integers(1, 900), width=st.integers(1, 40), kind=st.sampled_from(["objects", "arrays", "anyOf",
                                                                                     "refs"]),
       dialect=st.sampled_from(list(DIALECTS)))
def fuzz_one(server, depth, width, kind, dialect):
    if time.monotonic() > DEADLINE:
        return
    if kind in ("objects", "anyOf") and width ** min(depth, 12) > 50_000:
        return  # each level repeats the one below `width` times: past the body limit, another test's promise (413)
    path, body, _ = DIALECTS[dialect](nested(depth, width, kind))
    answer = httpx.post(server + path, json=body, timeout=120)
    assert answer.status_code in (200, 400, 413), (kind, depth, width, answer.status_code, answer.text[:300])


def test_a_fuzz_of_deep_and_wide_schemas_never_takes_the_server_down(server):
    global DEADLINE
    DEADLINE = time.monotonic() + 90  # bounded in time on a shared machine: examples past it are skipped
    fuzz_one(server)
    assert httpx.get(f"{server}/api/health", timeout=10).status_code == 200
    path, body, _ = chat({"type": "object", "properties": {"a": {"type": "string"}}})
    assert httpx.post(server + path, json=body, timeout=60).status_code == 200
