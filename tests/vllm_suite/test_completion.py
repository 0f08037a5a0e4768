"""vLLM's completion cases (tests/entrypoints/openai/completion/test_completion.py) against Serge's /v1/completions,
through the `openai` client; each docstring names the case it carries."""

from __future__ import annotations

import openai
import pytest

from .conftest import CHAT_MODEL

pytestmark = pytest.mark.real_model

IDS = [0, 0, 0, 0, 0]  # a prompt of token ids, as vLLM sends it


def complete(client, prompt, **kwargs):
    return client.completions.create(model=CHAT_MODEL, prompt=prompt, **kwargs)


def test_a_completion_counts_its_tokens_and_takes_token_ids(client):
    """test_single_completion (vLLM checks opt-125m's prompt size, 6 tokens; here the sum is checked)"""
    reply = complete(client, "Hello, my name is", max_tokens=5, temperature=0.0)
    assert reply.id and len(reply.choices) == 1
    choice = reply.choices[0]
    assert len(choice.text) >= 5 and choice.finish_reason == "length"
    assert reply.usage.completion_tokens == 5 and reply.usage.prompt_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 5
    assert reply.usage.prompt_tokens_details is not None
    reply = complete(client, IDS, max_tokens=5, temperature=0.0)
    assert len(reply.choices[0].text) >= 1 and reply.usage.prompt_tokens == len(IDS)


def test_a_completion_has_no_logprobs_unless_asked(client):
    """test_no_logprobs"""
    assert complete(client, IDS, max_tokens=5, temperature=0.0, logprobs=None).choices[0].logprobs is None


def test_zero_logprobs_give_the_chosen_token_only(client):
    """test_zero_logprobs"""
    logprobs = complete(client, IDS, max_tokens=5, temperature=0.0, logprobs=0).choices[0].logprobs
    assert logprobs.token_logprobs is not None and logprobs.top_logprobs is not None
    assert len(logprobs.top_logprobs[0]) == 1


def test_five_logprobs_give_five_or_six_tokens(client):
    """test_some_logprobs (five alternatives, and the chosen token when it is not among them)"""
    logprobs = complete(client, IDS, max_tokens=5, temperature=0.0, logprobs=5).choices[0].logprobs
    assert logprobs.token_logprobs is not None
    assert 5 <= len(logprobs.top_logprobs[0]) <= 6


def test_too_many_logprobs_is_a_400_and_the_server_answers_after(client):
    """test_too_many_completion_logprobs (OpenAI's limit on completions is 5; vLLM's 20)"""
    with pytest.raises(openai.BadRequestError):
        complete(client, IDS, max_tokens=5, temperature=0.0, logprobs=21)
    with pytest.raises(openai.BadRequestError):
        for _ in complete(client, IDS, max_tokens=5, temperature=0.0, logprobs=30, stream=True):
            pass
    assert complete(client, IDS, max_tokens=5, temperature=0.0).choices[0].text is not None


def test_a_streamed_completion_is_the_whole_one_in_pieces(client):
    """test_completion_streaming (on a prompt SmolLM2 goes on from: it ends "What is an LLM?" at once; and less
    vLLM's check that the finishing chunk has text: Serge's, as OpenAI's, may carry the finish reason alone)"""
    whole = complete(client, "Hello, my name is", max_tokens=5, temperature=0.0).choices[0].text
    pieces, finishes = [], 0
    for chunk in complete(client, "Hello, my name is", max_tokens=5, temperature=0.0, stream=True):
        pieces.append(chunk.choices[0].text)
        finishes += chunk.choices[0].finish_reason is not None
    assert finishes == 1 and chunk.choices[0].finish_reason == "length"
    assert "".join(pieces) == whole


def test_n_three_gives_three_different_completions(client):
    """test_parallel_no_streaming (less its check that the three end at different lengths, which SmolLM2 at
    temperature 1 may not do in 50 tokens, and on a prompt SmolLM2 goes on from; the distinct texts are checked)"""
    reply = complete(client, "Once upon a time", max_tokens=50, n=3, temperature=1.0, logprobs=0, seed=42)
    assert [choice.index for choice in reply.choices] == [0, 1, 2]
    assert all(choice.finish_reason is not None and choice.logprobs.tokens for choice in reply.choices)
    assert len({choice.text for choice in reply.choices}) == 3


def test_n_three_streams_three_different_completions(client):
    """test_parallel_streaming (as above; the pieces with text are counted: Serge's finishing chunk has none)"""
    pieces: list[list[str]] = [[], [], []]
    finishes = 0
    for chunk in complete(client, "Once upon a time", max_tokens=50, n=3, temperature=1.0, stream=True, seed=42):
        choice = chunk.choices[0]
        if choice.text:
            pieces[choice.index].append(choice.text)
        finishes += choice.finish_reason is not None
    assert finishes == 3
    assert all(len(piece) <= 50 for piece in pieces)
    assert len({"".join(piece) for piece in pieces}) == 3


def test_completion_usage_is_streamed_only_when_asked_and_last(client):
    """test_completion_stream_options (its include_usage parts; on a prompt SmolLM2 goes on from, where vLLM asks
    "What is the capital of France?", which SmolLM2 ends at once: no completion tokens to count)"""
    for options in ({"include_usage": False}, {}):
        for chunk in complete(client, "The capital of France is", max_tokens=5, temperature=0.0, stream=True,
                              stream_options=options):
            assert chunk.usage is None
    *replies, last = complete(client, "The capital of France is", max_tokens=5, temperature=0.0, stream=True,
                              stream_options={"include_usage": True})
    assert all(chunk.usage is None for chunk in replies)
    assert replies[-1].choices[0].finish_reason is not None
    assert last.choices == [] and last.usage.prompt_tokens > 0 and last.usage.completion_tokens > 0
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    for options in ({"include_usage": None}, {"include_usage": True}):
        with pytest.raises(openai.BadRequestError):
            complete(client, "The capital of France is", max_tokens=5, temperature=0.0, stream=False,
                     stream_options=options)


@pytest.mark.parametrize("prompts", [["Hello, my name is"] * 2, [IDS] * 2], ids=["texts", "token-ids"])
def test_a_batch_of_the_same_prompt_gives_the_same_completions(client, prompts):
    """test_batch_completions (less its n=2 part, which asks vLLM's beam search)"""
    batch = complete(client, prompts, max_tokens=5, temperature=0.0)
    assert len(batch.choices) == 2 and batch.choices[0].text == batch.choices[1].text
    texts = ["", ""]
    for chunk in complete(client, prompts, max_tokens=5, temperature=0.0, stream=True):
        assert len(chunk.choices) == 1
        texts[chunk.choices[0].index] += chunk.choices[0].text
    assert texts[0] == texts[1] == batch.choices[0].text
