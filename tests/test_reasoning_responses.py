"""A thinking model on OpenAI's Responses API, read by the official `openai` client's typed parsing: its
thoughts as a reasoning item before its message, whole and streamed, counted in usage, kept when stored;
reasoning items sent back as input are accepted and stay out of the prompt; effort none or minimal asks
for no thinking."""

from __future__ import annotations

import httpx
import pytest
from conftest import own_server
from openai import OpenAI
from openai.types.responses import (ResponseContentPartAddedEvent, ResponseContentPartDoneEvent,
                                    ResponseOutputItemAddedEvent, ResponseOutputItemDoneEvent,
                                    ResponseOutputMessage, ResponseReasoningItem, ResponseReasoningTextDeltaEvent,
                                    ResponseReasoningTextDoneEvent, ResponseTextDeltaEvent)
from standin import NAME, stand_in, standin_engine

# On the stand-in model (standin.py) behind a template that thinks: nothing here needs the real one
# (tests/test_thinking.py asks the real model).
settings = stand_in("settings")
THINK = 16  # tokens of thoughts before </think>
ASK = {"model": NAME, "input": "What is the capital of France?", "temperature": 0, "max_output_tokens": 80}


@pytest.fixture(scope="module")
def server(settings, tmp_path_factory):
    with standin_engine(settings, think_tokens=THINK) as thinker, \
            own_server(settings, thinker, tmp_path_factory.mktemp("responses-reasoning")) as url:
        yield url


@pytest.fixture(scope="module")
def client(server) -> OpenAI:
    return OpenAI(base_url=f"{server}/v1", api_key="not-needed", max_retries=0)


def thoughts(item: ResponseReasoningItem) -> str:
    assert item.summary == [] and [c.type for c in item.content] == ["reasoning_text"]
    return item.content[0].text


def test_a_thinking_reply_is_a_reasoning_item_then_its_message(client):
    reply = client.responses.create(**ASK)
    thought, message = reply.output
    assert isinstance(thought, ResponseReasoningItem) and isinstance(message, ResponseOutputMessage)
    assert thought.id.startswith("rs_") and thought.status == "completed"
    text = thoughts(thought)
    assert text.strip() and reply.output_text.strip()
    assert "think>" not in text + reply.output_text and text not in reply.output_text
    details = reply.usage.output_tokens_details
    assert THINK <= details.reasoning_tokens < reply.usage.output_tokens


def test_a_streamed_thinking_reply_sends_the_reasoning_events_first_and_adds_up_to_the_whole(client):
    whole = client.responses.create(**ASK)
    with client.responses.stream(**ASK) as stream:
        events = list(stream)
        final = stream.get_final_response()
    numbers = [e.sequence_number for e in events]
    assert numbers == list(range(len(numbers)))
    kinds = [e.type for e in events]
    reasoning = [e for e in events if getattr(e, "output_index", None) == 0]
    assert [e.type for e in reasoning[:2]] == ["response.output_item.added", "response.content_part.added"]
    assert isinstance(reasoning[0], ResponseOutputItemAddedEvent) and reasoning[0].item.type == "reasoning"
    assert isinstance(reasoning[1], ResponseContentPartAddedEvent) and reasoning[1].part.type == "reasoning_text"
    deltas = [e for e in reasoning if isinstance(e, ResponseReasoningTextDeltaEvent)]
    assert len(deltas) > 1  # live, a piece at a time
    ends = reasoning[-3:]
    assert isinstance(ends[0], ResponseReasoningTextDoneEvent) and isinstance(ends[1], ResponseContentPartDoneEvent)
    assert isinstance(ends[2], ResponseOutputItemDoneEvent) and ends[2].item.type == "reasoning"
    assert "".join(d.delta for d in deltas) == ends[0].text == thoughts(ends[2].item) == thoughts(whole.output[0])
    first_text = kinds.index("response.output_text.delta")
    assert kinds.index("response.output_item.done") < first_text  # the thoughts close before the answer begins
    assert all(isinstance(e, ResponseTextDeltaEvent) for e in events if e.type == "response.output_text.delta")
    assert [i.type for i in final.output] == ["reasoning", "message"]
    assert final.output_text == whole.output_text
    assert final.usage.output_tokens_details.reasoning_tokens == whole.usage.output_tokens_details.reasoning_tokens


@pytest.mark.parametrize("effort", ["none", "minimal"])
def test_effort_none_or_minimal_asks_for_no_thinking(client, effort):
    reply = client.responses.create(**ASK, reasoning={"effort": effort})
    assert [i.type for i in reply.output] == ["message"] and reply.output_text.strip()
    assert reply.usage.output_tokens_details.reasoning_tokens == 0
    assert reply.reasoning.effort == effort
    thinking = client.responses.create(**ASK, reasoning={"effort": "low"})
    assert [i.type for i in thinking.output] == ["reasoning", "message"]


def test_an_unknown_effort_is_a_400_naming_it(server):
    answer = httpx.post(f"{server}/v1/responses", json={**ASK, "reasoning": {"effort": "extreme"}}, timeout=60)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "reasoning.effort", answer.text


def test_reasoning_items_sent_back_are_accepted_and_stay_out_of_the_prompt(client):
    first = client.responses.create(**ASK, store=False)
    follow_up = {"role": "user", "content": "And of Spain?"}
    echoed = [item.model_dump(exclude_none=True) for item in first.output]  # as the Agents SDK and Codex send them
    assert echoed[0]["type"] == "reasoning"
    with_thoughts = client.responses.create(**{**ASK, "input": [
        {"role": "user", "content": ASK["input"]}, *echoed, follow_up]})
    without = client.responses.create(**{**ASK, "input": [
        {"role": "user", "content": ASK["input"]}, echoed[1], follow_up]})
    assert with_thoughts.usage.input_tokens == without.usage.input_tokens  # the thoughts are not in the prompt
    assert with_thoughts.output_text == without.output_text
    encrypted = {"type": "reasoning", "id": "rs_x", "summary": [{"type": "summary_text", "text": "I thought."}],
                 "encrypted_content": "gAAAA-opaque", "status": "completed"}
    assert client.responses.create(**{**ASK, "input": [encrypted, follow_up]}).output_text


def test_a_stored_response_keeps_its_reasoning_item_and_a_chain_continues_past_it(client):
    first = client.responses.create(**ASK)
    kept = client.responses.retrieve(first.id)
    assert [i.type for i in kept.output] == ["reasoning", "message"]
    assert thoughts(kept.output[0]) == thoughts(first.output[0])
    assert kept.usage.output_tokens_details.reasoning_tokens == first.usage.output_tokens_details.reasoning_tokens
    second = client.responses.create(**{**ASK, "input": "And of Spain?"}, previous_response_id=first.id)
    assert [i.type for i in second.output] == ["reasoning", "message"] and second.output_text.strip()
    by_hand = client.responses.create(**{**ASK, "input": [  # the chain without its thoughts
        {"role": "user", "content": ASK["input"]}, first.output[1].model_dump(exclude_none=True),
        {"role": "user", "content": "And of Spain?"}]})
    assert second.usage.input_tokens == by_hand.usage.input_tokens  # the stored thoughts are not in the prompt
