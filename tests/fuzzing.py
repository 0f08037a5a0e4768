"""Schemathesis over the app's own OpenAPI document: `fuzz_tests(path)` is a module's test of every operation
under a path (tests/test_fuzz_api.py for /api, tests/test_fuzz_v1.py for /v1; two files, so that two xdist
workers share the ~20 s of generating cases), against a real server over the stand-in model (standin.py), one
per module, with a 64-token context; a test module imports the fixtures below with it.

Every answer must be a non-5xx status that the OpenAPI document declares, with a declared content type, headers
and a body (each event of a stream) that match the declared schema. Not checked: that every schema-valid
request is accepted (some rules are not a schema's to state: a conversation longer than the context window, a
message that is only spaces), and that every schema-invalid one is refused (pydantic reads `true` as the number 1
and "1" as an integer, which JSON Schema calls wrong; the server uses them as sent).

Generation is kept short (the point is the HTTP layer): a completion asks for at most 4 tokens unless the
generated value is itself the fault, and the server's context is 64 tokens. An operation whose requests cannot
break its schema (free-text ids only) gets valid examples alone: looking for an invalid one was most of the
run's time, and never found one.
"""

from __future__ import annotations

from collections import Counter
from functools import cache

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as examples
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (content_type_conformance, response_headers_conformance,
                                               response_schema_conformance, status_code_conformance)

from conftest import server_of_its_own
from standin import stand_in

from serge.settings import Settings
from serge.web.app import build_app

settings, engine = stand_in("settings", "engine")
server = server_of_its_own(context_window=64)

EXAMPLES = 15  # per operation and per mode (valid, invalid)
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]


@cache
def document() -> dict:
    """The app's own OpenAPI document (building the app needs no engine); made once a process, as FastAPI
    takes a third of a second to write it."""
    return build_app(Settings(), None).openapi()


def operations(path_regex: str) -> list:
    """The operations whose path matches, known at collection. Accounts and keys are left to
    tests/test_accounts_api.py: a generated user would switch the server to login mode and every later
    operation would answer 401. MCP servers are left to tests/test_tool_servers.py: a generated one would send
    Serge connecting to whatever URL it names at each /api/tools."""
    schema = (schemathesis.openapi.from_dict(document()).include(path_regex=path_regex)
              .exclude(path_regex="^/api/(users|keys|mcp)"))
    return [result.ok() for result in schema.get_all_operations()]


def can_be_sent_wrong(operation) -> bool:
    """Whether some request breaks the operation's schema: one with a body, a query or a header, or a path
    parameter that is more than free text. Any text is a valid free-text id, so for the rest there is nothing
    to generate in the invalid mode (Hypothesis would spend seconds finding that out)."""
    if list(operation.body) or list(operation.query) or list(operation.headers):
        return True
    return any({k: v for k, v in p.definition["schema"].items() if k != "title"} != {"type": "string"}
               for p in operation.path_parameters)


@pytest.fixture(scope="module")
def tally():
    """Requests sent and statuses seen, printed at the end (pytest -s shows them)."""
    seen: dict[str, Counter] = {}
    yield seen
    total = sum(sum(c.values()) for c in seen.values())
    print(f"\nfuzzed {len(seen)} operations with {total} requests")
    for operation, statuses in seen.items():
        print(f"  {operation}: {dict(sorted(statuses.items()))}")


def short(case):
    """At most 4 new tokens for a completion or a response, unless the cap is the invalid part of the case."""
    body = case.body
    if isinstance(body, dict) and "messages" in body:
        wanted = body.get("max_tokens")
        if wanted is None or (type(wanted) is int and wanted > 4):
            body["max_tokens"] = 4
    if isinstance(body, dict) and "input" in body:  # /v1/responses
        wanted = body.get("max_output_tokens")
        if wanted is None or (type(wanted) is int and wanted > 4):
            body["max_output_tokens"] = 4
    return case


def real_ids(url: str) -> dict[str, str]:
    """A fresh chat with a question and an answer, and a stored response, so generated requests also reach real
    records."""
    exported = {"chat": {"title": "Fuzzed", "settings": {"max_new_tokens": 4}},
                "messages": [{"id": "q", "role": "user", "content": "Hi."},
                             {"id": "a", "parent_id": "q", "role": "assistant", "content": "Hello."}]}
    with httpx.Client(base_url=url, timeout=60) as http:
        chat = http.post("/api/chats/import", json=exported).json()
        response = http.post("/v1/responses", json={"input": "Hi.", "max_output_tokens": 2}).json()
    return {"chat_id": chat["id"], "message_id": chat["messages"][0]["id"], "response_id": response["id"]}


def fuzz(operation, server: str, tally: dict[str, Counter]) -> None:
    """Generated requests, valid and (where the schema can be broken) invalid, each answered as declared."""
    names = {p.name for p in operation.path_parameters}
    fixed = {k: v for k, v in real_ids(server).items() if k in names}
    statuses = tally.setdefault(operation.label, Counter())
    modes = [schemathesis.GenerationMode.POSITIVE]
    if can_be_sent_wrong(operation):
        modes.append(schemathesis.GenerationMode.NEGATIVE)
    for mode in modes:
        strategy = operation.as_strategy(generation_mode=mode)
        if fixed:
            strategy = st.one_of(strategy, operation.as_strategy(generation_mode=mode, path_parameters=fixed))
        strategy = strategy.map(short)

        @examples(max_examples=EXAMPLES, deadline=None, phases=[Phase.explicit, Phase.generate],
                  suppress_health_check=list(HealthCheck), database=None)
        @given(case=strategy)
        def answers_well(case):
            response = case.call_and_validate(base_url=server, checks=CHECKS, timeout=120)
            statuses[response.status_code] += 1

        try:
            answers_well()
        except Unsatisfiable:  # nothing in this operation can be sent wrong (no body, only free-text ids)
            assert mode is schemathesis.GenerationMode.NEGATIVE


def fuzz_tests(path_regex: str):
    """The test of a module: each operation whose path matches, fuzzed against the module's server."""

    @pytest.mark.parametrize("operation", operations(path_regex), ids=lambda op: op.label)
    def test_generated_requests_get_no_5xx_and_answers_match_the_schema(operation, server, tally):
        fuzz(operation, server, tally)

    return test_generated_requests_get_no_5xx_and_answers_match_the_schema
