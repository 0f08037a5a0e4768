"""vLLM's basic server cases (tests/entrypoints/openai/basic/test_basic.py) and the model list, against Serge;
each docstring names the case it carries."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from openai import OpenAI

from .conftest import CHAT_MODEL, EMBEDDING_MODEL

pytestmark = pytest.mark.real_model

STORY = [{"role": "user", "content": "Write a long story"}]


def test_health_says_ok_and_the_version(server):
    """test_check_health, and test_show_version's promise (vLLM's /version route; Serge's version is in its health)"""
    reply = httpx.get(f"{server}/api/health", timeout=30)
    assert reply.status_code == 200
    assert reply.json()["status"] == "ok" and reply.json()["version"]


def test_clients_that_gave_up_leave_room_for_the_next(server):
    """test_request_cancellation (vLLM sends 200 requests of 10,000 tokens at once; here 12 of 4,000, more than
    the model's slots, each cut by its client's 0.5 s timeout: were they not cancelled, the next request would
    wait minutes behind them)"""
    impatient = OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=0.5)

    def give_up(_):
        with pytest.raises(openai.APITimeoutError):
            impatient.chat.completions.create(model=CHAT_MODEL, messages=STORY, max_tokens=4000,
                                              extra_body={"ignore_eos": True})

    with ThreadPoolExecutor(12) as pool:
        list(pool.map(give_up, range(12)))
    patient = OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=30)
    reply = patient.chat.completions.create(model=CHAT_MODEL, messages=STORY, max_tokens=10)
    assert len(reply.choices) == 1


def test_a_body_that_is_not_json_is_refused(client):
    """test_request_wrong_content_type"""
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(model=CHAT_MODEL, messages=STORY, max_tokens=10,
                                       extra_headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert 400 <= refused.value.status_code < 500


def test_the_models_list_holds_the_chat_and_the_embedding_model_and_each_is_found_by_id(client):
    """The model list of vLLM's suite (client.models.list() in its test_basic fixtures and test_models): every
    served model, each retrievable by its id, and an unknown id a 404"""
    ids = [model.id for model in client.models.list().data]
    assert CHAT_MODEL in ids and EMBEDDING_MODEL in ids
    assert client.models.retrieve(CHAT_MODEL).id == CHAT_MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
