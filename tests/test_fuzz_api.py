"""Schemathesis sends generated requests, valid and invalid, to every operation under /api (Serge's own and
Ollama's); each answer is a declared non-5xx status with a body that matches its schema (tests/fuzzing.py says
what is checked and what is not). /v1 is tests/test_fuzz_v1.py's.

The server is a real one over the stand-in model (standin.py), one for the module, with a 64-token context.
"""

from __future__ import annotations

import pytest
from conftest import server_of_its_own
from fuzzing import fuzz, operations, tally  # noqa: F401 (tally is a fixture)
from standin import stand_in

settings, engine = stand_in("settings", "engine")
server = server_of_its_own(context_window=64)


@pytest.mark.parametrize("operation", operations("^/api/"), ids=lambda op: op.label)
def test_generated_requests_get_no_5xx_and_answers_match_the_schema(operation, server, tally):
    fuzz(operation, server, tally)
