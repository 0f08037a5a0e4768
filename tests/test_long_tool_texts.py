"""A tool's description as long as a real client writes one (Claude Code's Workflow tool: ~19,000 characters)
passes the request check on /v1/messages, /v1/chat/completions and /v1/responses through the official
anthropic and openai clients: the bundled model answers it where its window holds the prompt, and where the
window does not (the stand-in's, a token per byte), the 400 names the window, never the field."""

from __future__ import annotations

import pytest

from conftest import MODEL as REAL, own_server, server_of_its_own
from standin import NAME as MODEL, stand_in

settings, engine = stand_in("settings", "engine")
server = server_of_its_own()

# Instructions of the kind a coding agent's tool carries, repeated to Claude Code's length.
PARAGRAPH = ("Run a multi-step workflow over the repository. Plan each step before you act, read the files you "
             "will change, keep edits small, run the tests that cover them, and report what changed and why. ")
LONG = (PARAGRAPH * (19_000 // len(PARAGRAPH) + 1))[:19_000]
SCHEMA = {"type": "object", "properties": {"task": {"type": "string"}}, "required": ["task"]}
ASK = [{"role": "user", "content": "Say hello."}]


def anthropic_client(url: str):
    from anthropic import Anthropic

    return Anthropic(base_url=url, api_key="not-needed", max_retries=0, timeout=300)


def openai_client(url: str):
    from openai import OpenAI

    return OpenAI(base_url=f"{url}/v1", api_key="not-needed", max_retries=0, timeout=300)


def ask_all_three(url: str, model: str) -> list[str]:
    """The same long tool through each dialect's official client: each answer's finish (a refusal raises)."""
    messages = anthropic_client(url).messages.create(
        model=model, max_tokens=4, messages=ASK, extra_body={"temperature": 0},
        tools=[{"name": "Workflow", "description": LONG, "input_schema": SCHEMA}])
    chat = openai_client(url).chat.completions.create(
        model=model, max_tokens=4, messages=ASK, temperature=0,
        tools=[{"type": "function", "function": {"name": "Workflow", "description": LONG, "parameters": SCHEMA}}])
    response = openai_client(url).responses.create(
        model=model, max_output_tokens=16, input="Say hello.", temperature=0,
        tools=[{"type": "function", "name": "Workflow", "description": LONG, "parameters": SCHEMA}])
    return [messages.stop_reason, chat.choices[0].finish_reason, response.status]


def test_a_19000_character_description_that_overflows_the_window_is_refused_naming_the_window(server):
    from anthropic import BadRequestError as AnthropicBadRequest
    from openai import BadRequestError

    tool = {"name": "Workflow", "description": LONG, "input_schema": SCHEMA}
    with pytest.raises(AnthropicBadRequest) as refused:
        anthropic_client(server).messages.create(model=MODEL, max_tokens=4, messages=ASK, tools=[tool])
    function = {"name": "Workflow", "description": LONG, "parameters": SCHEMA}
    with pytest.raises(BadRequestError) as chat_refused:
        openai_client(server).chat.completions.create(model=MODEL, max_tokens=4, messages=ASK,
                                                      tools=[{"type": "function", "function": function}])
    with pytest.raises(BadRequestError) as responses_refused:
        openai_client(server).responses.create(model=MODEL, max_output_tokens=16, input="Say hello.",
                                               tools=[{"type": "function", **function}])
    for error in (refused.value, chat_refused.value, responses_refused.value):
        text = str(error)
        assert "context window" in text and "8192" in text, text
        assert "description" not in text and "10000 characters" not in text, text


@pytest.fixture(scope="module")
def bundled(real_settings, engines, tmp_path_factory):
    """A real server over the bundled model (8,192 tokens: a 19,000-character description fits)."""
    with own_server(real_settings, engines("auto"), tmp_path_factory.mktemp("long-tools")) as url:
        yield url


@pytest.mark.real_model
def test_the_bundled_model_answers_a_request_with_a_19000_character_tool_description(bundled):
    stop, finish, status = ask_all_three(bundled, REAL)
    assert stop in ("max_tokens", "end_turn", "tool_use") and finish in ("length", "stop", "tool_calls"), (stop, finish)
    assert status in ("completed", "incomplete"), status
