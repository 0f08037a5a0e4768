"""Conversations as clients send them: system messages anywhere, a prefill, explicit nulls, unknown message
keys, and a conversation too long for the window refused with its counts, never silently cut. On the
stand-in model (standin.py): these are the chat template's and the API's promises, not the model's."""

from __future__ import annotations

import httpx

from conftest import SMALL_WINDOW, server_of_its_own
from standin import NAME as MODEL, stand_in

settings, engine = stand_in("settings", "engine")
server = server_of_its_own()

QUESTION = {"role": "user", "content": "What is the capital of France? Answer in one sentence."}


def post(server: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server}/v1/chat/completions", json={"model": MODEL, "temperature": 0, **body}, timeout=120)


def test_two_leading_system_messages_are_one_system_prompt(server):
    apart = post(server, {"messages": [{"role": "system", "content": "Be brief."},
                                       {"role": "developer", "content": "Answer in English."}, QUESTION],
                          "max_tokens": 8})
    merged = post(server, {"messages": [{"role": "system", "content": "Be brief.\n\nAnswer in English."}, QUESTION],
                           "max_tokens": 8})
    assert apart.status_code == merged.status_code == 200, apart.text
    assert apart.json()["usage"]["prompt_tokens"] == merged.json()["usage"]["prompt_tokens"]
    assert apart.json()["choices"][0]["message"]["content"] == merged.json()["choices"][0]["message"]["content"]


def test_a_system_message_mid_conversation_stays_in_its_place(server, engine):
    messages = [QUESTION, {"role": "assistant", "content": "Paris."}, {"role": "system", "content": "Now in French."},
                {"role": "user", "content": "Say it again."}]
    reply = post(server, {"messages": messages, "max_tokens": 8})
    assert reply.status_code == 200, reply.text
    tokenizer = engine.model(MODEL).tokenizer
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert reply.json()["usage"]["prompt_tokens"] == len(rendered)  # the template's own placement


def test_a_last_assistant_message_is_continued_not_answered(server):
    whole = post(server, {"messages": [QUESTION], "max_tokens": 48}).json()["choices"][0]["message"]["content"]
    start = " ".join(whole.split()[:3])
    reply = post(server, {"messages": [QUESTION, {"role": "assistant", "content": start}], "max_tokens": 10})
    assert reply.status_code == 200, reply.text
    rest = reply.json()["choices"][0]["message"]["content"]
    assert not rest.startswith(start), "the prefill is not sent back"
    assert (start + rest).split()[:4] == whole.split()[:4], (start, rest, whole)


def test_fields_sent_as_null_are_fields_not_sent(server):
    nulls = {"n": None, "stream": None, "audio": None, "tools": None, "tool_choice": None, "temperature": None,
             "functions": None, "stream_options": None, "max_tokens": 4}
    reply = post(server, {"messages": [{**QUESTION, "name": None, "tool_calls": None}], **nulls})
    assert reply.status_code == 200, reply.text


def test_unknown_keys_inside_a_message_are_ignored(server):
    reply = post(server, {"messages": [{**QUESTION, "id": "msg-1", "timestamp": 12345}], "max_tokens": 4})
    assert reply.status_code == 200, reply.text
    refused = post(server, {"messages": [QUESTION], "max_tokens": 4, "no_such_field": 1})
    assert refused.status_code == 400 and "no_such_field" in refused.json()["error"]["message"]


def test_a_reply_names_what_served_it(server):
    whole = post(server, {"messages": [QUESTION], "max_tokens": 2}).json()
    assert whole["system_fingerprint"].startswith("fp_")
    with httpx.stream("POST", f"{server}/v1/chat/completions", timeout=60,
                      json={"messages": [QUESTION], "max_tokens": 2, "stream": True}) as stream:
        first = next(line for line in stream.iter_lines() if line.startswith("data: {"))
    assert '"system_fingerprint": "fp_' in first


def test_a_conversation_longer_than_the_window_is_refused_with_its_counts(small_standin_server):
    turns = []
    for i in range(20):  # about 1,000 tokens
        turns += [{"role": "user", "content": f"Tell me fact number {i} about the history of the city of Paris."},
                  {"role": "assistant", "content": f"Fact {i}: Paris was founded a very long time ago, long ago."}]
    reply = post(small_standin_server, {"messages": turns + [QUESTION], "max_tokens": 16})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert f"{SMALL_WINDOW} tokens" in error["message"] and "needs" in error["message"], error["message"]
