"""/v1/completions: raw text continued by the official openai client, no chat template, whole or streamed."""

from __future__ import annotations

import httpx
import pytest
from openai import OpenAI

from conftest import MODEL

pytestmark = pytest.mark.real_model  # the real model on a real server: the product's own promises

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=f"{server}/v1", api_key="unused")


def test_a_raw_prompt_is_continued_without_the_chat_template(client, engine):
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


def test_a_streamed_completion_adds_up_to_the_whole_one(client):
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0).choices[0].text
    pieces = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0, stream=True)
    chunks = list(pieces)
    assert "".join(c.choices[0].text for c in chunks) == whole
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")


@pytest.mark.parametrize("body, param, words", [
    ({"prompt": PROMPT, "suffix": " is a city."}, "suffix", "fill-in-the-middle"),
    ({"prompt": []}, "prompt", "1 to"),
    ({"prompt": PROMPT, "max_tokens": 0}, "max_tokens", ""),
    ({"prompt": PROMPT, "n": 9}, "n", "less than or equal to 8"),
    ({"prompt": PROMPT, "logprobs": 9}, "logprobs", ""),
    ({"prompt": PROMPT, "best_of": 2}, "best_of", "does not support"),
    ({"prompt": "x", "model": "all-minilm-l6-v2"}, "model", "embedding model"),
])
def test_bad_input_is_a_400_naming_the_field(server, body, param, words):
    reply = httpx.post(f"{server}/v1/completions", json={"model": MODEL, **body}, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and words in error["message"], error
