"""vLLM's logit_bias checks (tests/entrypoints/openai/chat_completion/test_chat_logit_bias_validation.py) against
Serge's /v1/chat/completions; each docstring names the case it carries. SmolLM2's vocabulary has 49,152 tokens
(vLLM's cases ask Qwen2.5's config; here the size is the model's own tokenizer's)."""

from __future__ import annotations

import openai
import pytest

from .conftest import CHAT_MODEL

pytestmark = pytest.mark.real_model

VOCABULARY = 49_152


def refusal(client, logit_bias) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=CHAT_MODEL, messages=[{"role": "user", "content": "Testing logit bias"}],
                                       max_tokens=5, logit_bias=logit_bias)
    assert refused.value.status_code == 400
    return refused.value


def test_a_bias_on_the_last_token_of_the_vocabulary_is_taken(client):
    """test_chat_logit_bias_valid"""
    reply = client.chat.completions.create(model=CHAT_MODEL, max_tokens=5, logit_bias={str(VOCABULARY - 1): 1.0},
                                           messages=[{"role": "user", "content": "Testing valid logit bias"}])
    assert reply.choices[0].message.content is not None


def test_a_bias_past_the_vocabulary_is_a_400_naming_the_token_and_the_size(client):
    """test_chat_logit_bias_invalid"""
    message = str(refusal(client, {str(VOCABULARY + 1): 1.0}))
    assert str(VOCABULARY + 1) in message and str(VOCABULARY) in message


def test_a_key_that_is_not_a_token_id_is_a_400_naming_it(client):
    """test_chat_logit_bias_non_integer_key"""
    message = str(refusal(client, {"not_a_token_id": 50}))
    assert "not_a_token_id" in message and "logit_bias" in message


def test_a_bias_that_is_not_a_number_is_a_400_naming_logit_bias(client):
    """test_chat_logit_bias_non_numeric_value"""
    assert "logit_bias" in str(refusal(client, {"1": "not_a_number"}))


def test_every_key_that_is_not_a_token_id_is_named(client):
    """test_chat_logit_bias_multiple_non_integer_keys"""
    message = str(refusal(client, {"bad1": 50.0, "bad2": 20.0}))
    assert "bad1" in message and "bad2" in message
