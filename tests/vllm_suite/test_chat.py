"""vLLM's chat completion cases (tests/entrypoints/openai/chat_completion/test_chat.py and basic/test_chat_echo.py)
against Serge's /v1/chat/completions, through the `openai` client; each docstring names the case it carries."""

from __future__ import annotations

import json
from collections import defaultdict

import jsonschema
import openai
import pytest

from .conftest import CHAT_MODEL

pytestmark = pytest.mark.real_model

ONE_PLUS_ONE = [
    {"role": "system", "content": "you are a helpful assistant"},
    {"role": "user", "content": "what is 1+1?"},
]
FRANCE = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]


def ask(client, messages=ONE_PLUS_ONE, **kwargs):
    return client.chat.completions.create(model=CHAT_MODEL, messages=messages, **kwargs)


def test_a_reply_has_no_logprobs_unless_asked(client):
    """test_no_logprobs_chat"""
    reply = ask(client, max_completion_tokens=5, temperature=0.0, logprobs=False)
    assert reply.choices[0].logprobs is None


def test_zero_top_logprobs_give_each_token_and_no_alternatives(client):
    """test_zero_logprobs_chat"""
    reply = ask(client, max_completion_tokens=5, temperature=0.0, logprobs=True, top_logprobs=0)
    content = reply.choices[0].logprobs.content
    assert content is not None and len(content[0].top_logprobs) == 0


def test_five_top_logprobs_give_five_alternatives(client):
    """test_some_logprobs_chat"""
    reply = ask(client, max_completion_tokens=5, temperature=0.0, logprobs=True, top_logprobs=5)
    assert len(reply.choices[0].logprobs.content[0].top_logprobs) == 5


def test_more_top_logprobs_than_twenty_is_a_400_and_the_server_answers_after(client):
    """test_too_many_chat_logprobs"""
    with pytest.raises(openai.BadRequestError):
        for _ in ask(client, max_completion_tokens=10, logprobs=True, top_logprobs=21, stream=True):
            pass
    with pytest.raises(openai.BadRequestError):
        ask(client, max_completion_tokens=10, logprobs=True, top_logprobs=30)
    assert ask(client, max_completion_tokens=10).choices[0].message.content is not None


def test_a_session_of_two_turns_counts_its_tokens(client):
    """test_single_chat_session (vLLM checks zephyr's prompt size, 37 tokens; here the sum is checked)"""
    messages = list(ONE_PLUS_ONE)
    reply = ask(client, messages, max_completion_tokens=5, logprobs=True, top_logprobs=5)
    assert reply.id and len(reply.choices) == 1
    choice = reply.choices[0]
    assert choice.finish_reason == "length"
    assert reply.usage.completion_tokens == 5
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 5 and reply.usage.prompt_tokens > 0
    assert choice.message.role == "assistant" and len(choice.message.content) >= 5
    messages += [{"role": "assistant", "content": choice.message.content},
                 {"role": "user", "content": "express your result in json"}]
    assert ask(client, messages, max_completion_tokens=5).choices[0].message.content is not None


def test_a_stream_at_temperature_zero_is_the_whole_reply_in_pieces(client):
    """test_chat_streaming"""
    whole = ask(client, max_completion_tokens=10, temperature=0.0).choices[0]
    pieces, finishes = [], 0
    for chunk in ask(client, max_completion_tokens=10, temperature=0.0, stream=True):
        delta = chunk.choices[0].delta
        assert delta.role in (None, "assistant")
        if delta.content:
            pieces.append(delta.content)
        finishes += chunk.choices[0].finish_reason is not None
    assert finishes == 1, "the finish reason comes in the last chunk only"
    assert chunk.choices[0].finish_reason == whole.finish_reason
    assert "".join(pieces) == whole.message.content


def test_usage_is_streamed_only_when_asked_and_last(client):
    """test_chat_completion_stream_options (its include_usage parts)"""
    for chunk in ask(client, FRANCE, max_completion_tokens=10, temperature=0.0, stream=True,
                     stream_options={"include_usage": False}):
        assert chunk.usage is None
    chunks = list(ask(client, FRANCE, max_completion_tokens=10, temperature=0.0, stream=True,
                      stream_options={"include_usage": True}))
    *replies, last = chunks
    assert all(chunk.usage is None for chunk in replies)
    assert replies[-1].choices[0].finish_reason is not None
    assert last.choices == [] and last.usage.prompt_tokens > 0 and last.usage.completion_tokens > 0
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    for options in ({"include_usage": None}, {"include_usage": True}):
        with pytest.raises(openai.BadRequestError):
            ask(client, FRANCE, max_completion_tokens=10, temperature=0.0, stream=False, stream_options=options)


def test_response_format_json_object_gives_a_json_object(client):
    """test_response_format_json_object (zephyr-7b answers {"result": 2}; of SmolLM2 the shape is checked)"""
    for _ in range(2):
        reply = ask(client, [{"role": "user", "content": 'what is 1+1? please respond with a JSON object, the '
                                                         'format is {"result": 2}'}],
                    response_format={"type": "json_object"}, max_completion_tokens=60)
        assert isinstance(json.loads(reply.choices[0].message.content), dict)


def test_response_format_json_schema_gives_an_instance_of_the_schema(client):
    """test_response_format_json_schema (zephyr-7b's {"result": 2}; here any instance of the schema)"""
    schema = {"type": "object", "properties": {"result": {"type": "integer"}}}
    for _ in range(2):
        reply = ask(client, [{"role": "user", "content": 'what is 1+1? The format is "result": 2'}],
                    max_completion_tokens=60,
                    response_format={"type": "json_schema", "json_schema": {"name": "foo_test", "schema": schema}})
        jsonschema.validate(json.loads(reply.choices[0].message.content), schema)


def test_response_format_text_gives_text(client):
    """test_response_format_text"""
    for _ in range(2):
        reply = ask(client, [{"role": "user", "content": "what is 1+1?"}], max_completion_tokens=10,
                    response_format={"type": "text"})
        assert reply.choices[0].message.content is not None


def test_a_message_key_it_does_not_know_is_ignored(client):
    """test_extra_fields_allowed"""
    reply = ask(client, [{"role": "user", "content": "what is 1+1?", "extra_field": "0"}], temperature=0, seed=0,
                max_completion_tokens=10)
    assert reply.choices[0].message.content is not None


def test_text_parts_are_read_as_the_same_text(client):
    """test_complex_message_content (zephyr answers "2"; here the parts must give the reply the plain text gives)"""
    text = "what is 1+1? please provide the result without any other text."
    plain = ask(client, [{"role": "user", "content": text}], temperature=0, seed=0, max_completion_tokens=10)
    parts = ask(client, [{"role": "user", "content": [{"type": "text", "text": text}]}], temperature=0, seed=0,
                max_completion_tokens=10)
    assert parts.choices[0].message.content == plain.choices[0].message.content


@pytest.mark.parametrize("seed", [-(2 ** 63) - 1, 2 ** 64])
def test_a_seed_beyond_64_bits_is_a_400(client, seed):
    """test_long_seed (vLLM's bounds are a signed 64-bit integer's; Serge takes any seed that fits in 64 bits)"""
    with pytest.raises(openai.BadRequestError) as refused:
        ask(client, [{"role": "system", "content": "You are a helpful assistant."}], temperature=0, seed=seed)
    assert "64 bits" in refused.value.message


def test_n_three_gives_three_different_choices(client):
    """test_chat_completion_n_parameter_non_streaming"""
    reply = ask(client, [{"role": "system", "content": "You are a helpful assistant."},
                         {"role": "user", "content": "What is the opposite of big?"}],
                max_completion_tokens=20, temperature=0.7, n=3)
    assert [choice.index for choice in reply.choices] == [0, 1, 2]
    assert all(choice.message.content for choice in reply.choices)
    assert len({choice.message.content for choice in reply.choices}) > 1


def test_n_two_streams_both_choices(client):
    """test_chat_completion_n_parameter_streaming"""
    pieces = defaultdict(list)
    for chunk in ask(client, FRANCE, max_completion_tokens=15, temperature=0.7, n=2, stream=True):
        for choice in chunk.choices:
            if choice.delta.content:
                pieces[choice.index].append(choice.delta.content)
    assert "".join(pieces[0]) and "".join(pieces[1])


def test_n_two_with_a_seed_gives_two_choices(client):
    """test_chat_completion_n_with_seed"""
    reply = ask(client, [{"role": "user", "content": "Say hello."}], max_completion_tokens=10, temperature=0.8, n=2,
                seed=42)
    assert [choice.index for choice in reply.choices] == [0, 1]
    assert all(choice.message.content for choice in reply.choices)


def test_n_one_gives_one_choice(client):
    """test_chat_completion_n_equals_1"""
    reply = ask(client, [{"role": "user", "content": "Hello!"}], max_completion_tokens=10, temperature=0.7, n=1)
    assert len(reply.choices) == 1 and reply.choices[0].index == 0 and reply.choices[0].message.content is not None


def test_a_final_assistant_message_is_continued_not_repeated(client):
    """test_chat_echo.py::test_chat_session_with_echo_and_continue_final_message[echo=False] (vLLM asks with
    continue_final_message and add_generation_prompt; Serge continues a final assistant message by itself)"""
    saying = "Here is a common saying about apple. An apple a day, keeps"
    reply = ask(client, [{"role": "user", "content": "tell me a common saying"},
                         {"role": "assistant", "content": saying}], max_completion_tokens=20)
    choice = reply.choices[0]
    assert choice.finish_reason in ("stop", "length") and choice.message.role == "assistant"
    assert choice.message.content is not None and saying not in choice.message.content
