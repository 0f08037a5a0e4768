"""A model that thinks has its thoughts apart from its answer: in the stream, the record and /v1's
reasoning_content, /v1/responses' reasoning items; reasoning_effort none asks its template not to think."""

from __future__ import annotations

import copy
import dataclasses
import json

import httpx
import pytest

from serge.engine import Engine
from serge.engine.generation.prompting.thinking import Thinking, opens_thinking, template_thinks
from serge.web.app import build_app

from conftest import MODEL, ServerThread, held_port

pytestmark = pytest.mark.real_model  # the real model on a real server: the product's own promises

# DeepSeek-R1's way: the template opens <think> for the model, unless asked not to think.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}")


def split(pieces: list[str], inside: bool = False) -> tuple[str, str]:
    thinking, answer, thought = Thinking(inside), [], []
    for piece in pieces:
        a, t = thinking.feed(piece)
        answer.append(a)
        thought.append(t)
    a, t = thinking.close()
    return "".join(answer) + a, "".join(thought) + t


@pytest.mark.parametrize("size", [1, 2, 3, 7, 100])
def test_thoughts_and_answer_split_wherever_the_pieces_break(size):
    text = "<think>Paris is in France.\nSo: Paris.</think>\n\nThe capital is Paris. <think> is just text here."
    pieces = [text[i:i + size] for i in range(0, len(text), size)]
    assert split(pieces) == ("The capital is Paris. <think> is just text here.", "Paris is in France.\nSo: Paris.")
    assert split([p for p in "I opened it.</think>Answer."], inside=True) == ("Answer.", "I opened it.")
    assert split(["no tags at all, a < sign"]) == ("no tags at all, a < sign", "")
    assert split(["<think>never closed"]) == ("", "never closed")


def test_a_template_that_thinks_is_told_apart(engine):
    tokenizer = engine.model(MODEL).tokenizer
    assert not template_thinks(tokenizer)
    thinker = copy.deepcopy(tokenizer)
    thinker.chat_template = THINKING_TEMPLATE
    assert template_thinks(thinker)
    assert opens_thinking("<|im_start|>assistant\n<think>\n") and not opens_thinking("<think>\n\n</think>\n\n")


@pytest.fixture(scope="module")
def thinking_server(settings, engine):
    """The real model behind a template that thinks, served through the engine's door."""
    local = engine.model(MODEL)
    tokenizer = copy.deepcopy(local.tokenizer)
    tokenizer.chat_template = THINKING_TEMPLATE
    thinker = dataclasses.replace(local, name="thinker", tokenizer=tokenizer)
    own = settings.model_copy(update={"port": held_port(), "default_model": "thinker"})
    with Engine(own, backends={"thinker": thinker}) as served, ServerThread(build_app(own, served), own.port) as s:
        yield s.url


def ask(url: str, **extra) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
        "model": "thinker", "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "temperature": 0, "max_tokens": 12, **extra})


def test_a_reply_inside_the_opened_tag_is_reasoning_and_a_reply_told_not_to_think_is_an_answer(thinking_server):
    thought = ask(thinking_server).json()["choices"][0]["message"]
    assert thought.get("reasoning_content") and not thought["content"], thought  # 12 tokens, still thinking
    answered = ask(thinking_server, reasoning_effort="none").json()["choices"][0]["message"]
    assert answered["content"] and "reasoning_content" not in answered, answered
    assert "<think>" not in answered["content"] and "</think>" not in thought["reasoning_content"]


def test_streamed_thoughts_come_as_reasoning_content_deltas(thinking_server):
    whole = ask(thinking_server).json()["choices"][0]["message"]["reasoning_content"]
    with httpx.stream("POST", f"{thinking_server}/v1/chat/completions", timeout=120, json={
            "model": "thinker", "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "temperature": 0, "max_tokens": 12, "stream": True}) as reply:
        chunks = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == whole
    assert not "".join(d.get("content") or "" for d in deltas)


def test_ollama_chat_gives_the_thoughts_in_thinking_and_think_false_turns_them_off(thinking_server):
    def chat(**extra) -> dict:
        return httpx.post(f"{thinking_server}/api/chat", timeout=120, json={
            "model": "thinker", "stream": False, "options": {"temperature": 0, "num_predict": 12},
            "messages": [{"role": "user", "content": "What is the capital of France?"}], **extra}).json()["message"]

    thought, answered = chat(), chat(think=False)
    assert thought.get("thinking") and not thought["content"], thought
    assert answered["content"] and "thinking" not in answered, answered


def test_anthropic_messages_give_the_thoughts_as_a_thinking_block(thinking_server):
    from anthropic import Anthropic

    client = Anthropic(base_url=thinking_server, api_key="unused")
    ask_it = {"model": "thinker", "max_tokens": 12, "messages": [{"role": "user", "content": "Capital of France?"}],
              "extra_body": {"temperature": 0}}
    thought = client.messages.create(**ask_it)
    assert [b.type for b in thought.content][0] == "thinking" and thought.content[0].thinking
    answered = client.messages.create(**ask_it, thinking={"type": "disabled"})
    assert [b.type for b in answered.content] == ["text"] and answered.content[0].text
    with client.messages.stream(**ask_it) as stream:
        kinds = [e.delta.type for e in stream if e.type == "content_block_delta"]
    assert kinds and set(kinds) == {"thinking_delta"}


def test_responses_give_the_thoughts_as_a_reasoning_item_and_effort_none_turns_them_off(thinking_server):
    from openai import OpenAI
    from openai.types.responses import ResponseReasoningItem

    client = OpenAI(base_url=f"{thinking_server}/v1", api_key="unused", max_retries=0)
    ask_it = {"model": "thinker", "input": "What is the capital of France?", "temperature": 0,
              "max_output_tokens": 12}
    thought = client.responses.create(**ask_it)  # it never closes </think> here: every token is a thought
    assert isinstance(thought.output[0], ResponseReasoningItem) and thought.output[0].content[0].text.strip()
    assert [i.type for i in thought.output] == ["reasoning", "message"] and not thought.output_text
    assert thought.usage.output_tokens_details.reasoning_tokens == thought.usage.output_tokens > 0
    with client.responses.stream(**ask_it) as stream:
        streamed = "".join(e.delta for e in stream if e.type == "response.reasoning_text.delta")
    assert streamed == thought.output[0].content[0].text
    answered = client.responses.create(**ask_it, reasoning={"effort": "none"})
    assert [i.type for i in answered.output] == ["message"] and answered.output_text.strip()
