"""Schemathesis sends generated requests, valid and invalid, to every operation under /v1 (OpenAI's and
Anthropic's); each answer is a declared non-5xx status with a body that matches its schema (tests/fuzzing.py says
what is checked and what is not, and serves them). /api is tests/test_fuzz_api.py's."""

from fuzzing import engine, fuzz_tests, server, settings, tally  # noqa: F401 (the fixtures the test takes)

test_generated_requests_get_no_5xx_and_answers_match_the_schema = fuzz_tests("^/v1/")
