"""/v1/completions: raw text continued by the official openai client, no chat template, whole or streamed.

On the stand-in model (standin.py); a raw prompt and a stream go through the real model on each local
engine too (`real_model`), and an embedding model named here needs the real library."""

from __future__ import annotations

import httpx
import pytest
from openai import OpenAI

from conftest import MODEL as REAL, server_of_its_own
from standin import NAME as MODEL, stand_in, standin_engine

settings = stand_in("settings")
server = server_of_its_own()


@pytest.fixture(scope="module")
def engine(settings):
    """A stand-in that never ends a text itself: it ends a turn, and a raw prompt has none."""
    with standin_engine(settings, reply_tokens=None) as made:
        yield made

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=f"{server}/v1", api_key="unused")


@pytest.fixture(scope="module")
def real_client(real_server):
    return OpenAI(base_url=f"{real_server}/v1", api_key="unused")


@pytest.mark.real_model
def test_a_raw_prompt_is_continued_without_the_chat_template(real_client, both_engines):
    client, engine, MODEL = real_client, both_engines, REAL
    reply = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    [choice] = reply.choices
    assert choice.text and not choice.text.startswith(PROMPT) and choice.finish_reason in ("length", "stop")
    tokenizer = engine.model(MODEL).tokenizer
    assert reply.usage.prompt_tokens == len(tokenizer(PROMPT)["input_ids"])  # no template around it
    assert reply.usage.completion_tokens <= 8 and reply.object == "text_completion"


def test_echo_logprobs_stop_and_several_prompts(client):
    echoed = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, echo=True,
                                       logprobs=2)
    text, logprobs = echoed.choices[0].text, echoed.choices[0].logprobs
    assert text.startswith(PROMPT) and len(logprobs.tokens) == len(logprobs.token_logprobs) == 4
    assert all(len(alternatives) == 2 for alternatives in logprobs.top_logprobs)
    assert "".join(logprobs.tokens) == text[len(PROMPT):] and logprobs.text_offset[0] == len(PROMPT)
    two = client.completions.create(model=MODEL, prompt=[PROMPT, "One, two, three,"], max_tokens=6, temperature=0)
    assert [c.index for c in two.choices] == [0, 1] and two.choices[1].text != two.choices[0].text
    alone = client.completions.create(model=MODEL, prompt="One, two, three,", max_tokens=6, temperature=0)
    assert alone.choices[0].text == two.choices[1].text  # greedy: the same beside another prompt


@pytest.mark.real_model
def test_a_streamed_completion_adds_up_to_the_whole_one(real_client):
    client, MODEL = real_client, REAL
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0).choices[0].text
    pieces = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0, stream=True)
    chunks = list(pieces)
    assert "".join(c.choices[0].text for c in chunks) == whole
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")


def test_token_ids_are_a_prompt_as_they_are_and_top_logprobs_hold_the_sampled_token(client):
    ids = [5, 6, 7, 8]
    reply = client.completions.create(model=MODEL, prompt=[ids, [9, 10]], max_tokens=3, temperature=0, logprobs=0)
    assert [c.index for c in reply.choices] == [0, 1] and reply.choices[0].text
    alone = client.completions.create(model=MODEL, prompt=ids, max_tokens=3, temperature=0)
    assert alone.usage.prompt_tokens == len(ids) and alone.choices[0].text == reply.choices[0].text
    logprobs = reply.choices[0].logprobs  # OpenAI's: up to logprobs + 1 per token, the sampled one among them
    assert [list(top) for top in logprobs.top_logprobs] == [[token] for token in logprobs.tokens]


@pytest.mark.parametrize("body, param, words", [
    ({"prompt": PROMPT, "suffix": " is a city."}, "suffix", "fill-in-the-middle"),
    ({"prompt": []}, "prompt", "1 to"),
    ({"prompt": PROMPT, "max_tokens": 0}, "max_tokens", ""),
    ({"prompt": PROMPT, "n": 9}, "n", "less than or equal to 8"),
    ({"prompt": PROMPT, "logprobs": 9}, "logprobs", ""),
    ({"prompt": PROMPT, "best_of": 2}, "best_of", "does not support"),
    ({"prompt": [[]]}, "prompt", "0 token ids"),
    ({"prompt": [1, 10 ** 9]}, "prompt", "this model's"),
    ({"prompt": [1, 2], "suffix": " is a city."}, "suffix", "text prompt"),
    ({"prompt": [1, 2], "echo": True}, "echo", "as text"),
    ({"prompt": [True, 2]}, "prompt", "token ids (integers"),
    ({"prompt": [[3], [False]]}, "prompt", "token ids (integers"),
    ({"prompt": [1.0]}, "prompt", "token ids (integers"),
    ({"prompt": [[1], "a"]}, "prompt", "a list of texts"),
    ({"prompt": [5] * 30_000}, "prompt", "context window"),
])
def test_bad_input_is_a_400_naming_the_field(server, body, param, words, model=MODEL):
    reply = httpx.post(f"{server}/v1/completions", json={"model": model, **body}, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and words in error["message"], error


@pytest.mark.real_model
def test_an_embedding_model_is_a_400_naming_model(real_server):
    test_bad_input_is_a_400_naming_the_field(real_server, {"prompt": "x", "model": "all-minilm-l6-v2"}, "model",
                                             "embedding model", REAL)
