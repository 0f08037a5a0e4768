"""n choices on /v1/chat/completions and /v1/completions; max_tokens capped to the room the prompt leaves
(/v1/messages, Ollama's num_ctx) with the prompt rendered once; stop strings as editor plugins send them.

On the stand-in (standin.py) but the last test, which runs the official openai client against the real
model on each local engine (a copied KV that were wrong would show there).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict

import httpx
import pytest
from openai import OpenAI

from serge.engine import ChatRequest, Message, SamplingParams
from serge.engine.generation.prompting import prompts
from serge.engine.generation.batching.scheduler import SchedulerLimits
from serge.web.openai.chat_models import MAX_CHOICES

from conftest import MODEL as REAL_MODEL, own_server
from standin import NAME as MODEL, StandInForward, StandInKV, cancelled, shared_tokenizer, standin_model

# The stand-in's engine and server go by their own names (standin_engine, standin_server), so that the
# real-model test at the end gets conftest's real settings.

ASK = [{"role": "user", "content": "Name three colours."}]
LONG = [{"role": "user", "content": "Write a long story."}]  # the stand-in never ends a reply to "long"


@pytest.fixture(scope="module")
def client(standin_server):
    return OpenAI(base_url=f"{standin_server}/v1", api_key="unused", max_retries=0)


def _streamed(chunks) -> tuple[dict[int, str], dict[int, str]]:
    """Each choice's text and finish_reason, assembled from its own chunks."""
    texts, finishes = defaultdict(str), {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason is not None:
                finishes[choice.index] = choice.finish_reason
    return dict(texts), finishes


def test_three_choices_whole_and_streamed_are_the_same_by_index(client):
    ask = dict(model=MODEL, messages=ASK, n=3, seed=11, temperature=1.0, max_tokens=40)
    whole = client.chat.completions.create(**ask)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    texts, finishes = _streamed(client.chat.completions.create(**ask, stream=True))
    assert texts == {c.index: c.message.content for c in whole.choices}
    assert finishes == {c.index: c.finish_reason for c in whole.choices}
    alone = client.chat.completions.create(**{**ask, "n": 1})
    assert alone.choices[0].message.content == whole.choices[0].message.content  # choice 0 has the seed itself


def test_sampled_choices_differ_and_greedy_ones_are_equal(client):
    sampled = client.chat.completions.create(model=MODEL, messages=ASK, n=4, seed=3, temperature=1.5, max_tokens=40)
    assert len({c.message.content for c in sampled.choices}) > 1
    greedy = client.chat.completions.create(model=MODEL, messages=ASK, n=4, temperature=0, max_tokens=40)
    assert len({c.message.content for c in greedy.choices}) == 1


def test_usage_counts_the_prompt_once_and_every_choice(client):
    one = client.chat.completions.create(model=MODEL, messages=LONG, n=1, max_tokens=5)
    three = client.chat.completions.create(model=MODEL, messages=LONG, n=3, max_tokens=5)
    assert three.usage.prompt_tokens == one.usage.prompt_tokens
    assert three.usage.completion_tokens == 15 and [c.finish_reason for c in three.choices] == ["length"] * 3
    assert three.usage.total_tokens == one.usage.prompt_tokens + 15
    chunks = list(client.chat.completions.create(model=MODEL, messages=LONG, n=3, max_tokens=5, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens == one.usage.prompt_tokens and chunks[-1].usage.completion_tokens == 15


def test_logprobs_and_tool_calls_come_per_choice(client):
    reply = client.chat.completions.create(model=MODEL, messages=ASK, n=2, seed=5, temperature=1.0, max_tokens=12,
                                           logprobs=True, top_logprobs=2)
    for choice in reply.choices:
        assert "".join(t.token for t in choice.logprobs.content) == choice.message.content
    tool = {"type": "function", "function": {"name": "colour", "parameters": {
        "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}}
    called = client.chat.completions.create(model=MODEL, messages=ASK, n=3, seed=5, temperature=1.0, max_tokens=60,
                                            tools=[tool], tool_choice="required")
    calls = [c.message.tool_calls for c in called.choices]
    assert all(len(c) == 1 and c[0].function.name == "colour" for c in calls)
    assert all(isinstance(json.loads(c[0].function.arguments)["name"], str) for c in calls)
    assert len({c[0].id for c in calls}) == 3 and [c.finish_reason for c in called.choices] == ["tool_calls"] * 3


def test_n_above_the_limit_is_a_400_naming_it(standin_server):
    for path, body in (("chat/completions", {"messages": ASK}), ("completions", {"prompt": "a"})):
        reply = httpx.post(f"{standin_server}/v1/{path}", json={**body, "n": MAX_CHOICES + 1}, timeout=30)
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["param"] == "n" and str(MAX_CHOICES) in error["message"]


def test_the_prompt_is_prefilled_once_for_every_choice(client, standin_engine):
    before = standin_engine.metrics.snapshot()[MODEL]
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "A new question?"}],
                                           n=4, seed=1, max_tokens=8)
    after = standin_engine.metrics.snapshot()[MODEL]
    run = after.prefilled_tokens - before.prefilled_tokens
    reused = after.reused_tokens - before.reused_tokens
    assert run > 0 and run + reused == reply.usage.prompt_tokens  # once, not four times
    assert after.prompt_tokens - before.prompt_tokens == reply.usage.prompt_tokens


def test_a_client_that_leaves_cancels_every_choice(standin_server, standin_engine):
    before = cancelled(standin_engine)
    with httpx.stream("POST", f"{standin_server}/v1/chat/completions", timeout=60, json={
            "messages": LONG, "n": 3, "stream": True, "max_tokens": 4000}) as reply:
        for i, _ in enumerate(reply.iter_lines()):
            if i >= 12:
                break
    deadline = time.monotonic() + 20
    while cancelled(standin_engine) < before + 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cancelled(standin_engine) == before + 3, "a choice went on after its client left"
    assert standin_engine.model(MODEL).scheduler.pending == 0


def test_completions_give_n_choices_per_prompt_in_order(client):
    ask = dict(model=MODEL, prompt=["Once upon", "In a land"], n=2, seed=9, temperature=1.0, max_tokens=10)
    whole = client.completions.create(**ask)
    assert [c.index for c in whole.choices] == [0, 1, 2, 3]
    texts = defaultdict(str)
    for chunk in client.completions.create(**ask, stream=True):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert dict(texts) == {c.index: c.text for c in whole.choices}
    one = client.completions.create(model=MODEL, prompt="Once upon", max_tokens=10)
    assert whole.usage.prompt_tokens == one.usage.prompt_tokens + client.completions.create(
        model=MODEL, prompt="In a land", max_tokens=1).usage.prompt_tokens  # each prompt once
    assert whole.usage.completion_tokens == 40


# --- the scheduler's side, without HTTP ----------------------------------------------------------------------
def test_more_choices_than_slots_is_refused_before_anything_runs():
    model = standin_model(limits=SchedulerLimits(max_running=2))
    try:
        with pytest.raises(ValueError, match="SERGE_MAX_RUNNING"):
            model.submit(ChatRequest([Message("user", "hi")], SamplingParams(max_new_tokens=4), n=3))
        assert model.scheduler.pending == 0
    finally:
        model.close()


def _ended(stream) -> tuple:
    """The stream's records once every choice has ended on its own (nothing here cancels it)."""
    deadline = time.monotonic() + 30
    while not stream.done and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stream.done, "a choice was left running"
    return stream.records


def test_a_request_for_n_waits_for_n_slots_and_none_behind_it_passes():
    forward = StandInForward(reply_tokens=None)
    model = standin_model(forward=forward, limits=SchedulerLimits(max_running=2))
    try:
        ask, short = [Message("user", "hi")], SamplingParams(max_new_tokens=4)
        running = model.submit(ChatRequest(ask, SamplingParams(max_new_tokens=8000)))
        pair = model.submit(ChatRequest(ask, short, n=2))  # needs both slots
        single = model.submit(ChatRequest(ask, short))  # would fit beside `running`, but comes after the pair
        passes = forward.passes
        deadline = time.monotonic() + 30
        while forward.passes < passes + 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert running.queue_position is None and (pair.queue_position, single.queue_position) == (0, 1)
        running.cancel()
        assert [r.completion_tokens for r in _ended(pair)] == [4, 4] and _ended(single)[0].completion_tokens == 4
    finally:
        model.close()


class _FailingPrefill(StandInForward):
    def prefill(self, kv, tokens):
        raise RuntimeError("prefill broke")


class _UncopiableKV(StandInKV):
    def copy(self, length):
        raise RuntimeError("no room for a copy")


class _UncopiableForward(StandInForward):
    def new_kv(self):
        return _UncopiableKV()


def test_a_failed_prefill_ends_every_choice_and_the_stream():
    model = standin_model(forward=_FailingPrefill())
    try:
        records = _ended(model.submit(ChatRequest([Message("user", "hi")], SamplingParams(max_new_tokens=4), n=3)))
        assert [r.finish_reason.value for r in records] == ["error"] * 3
        assert all("prefill broke" in r.error for r in records) and model.scheduler.pending == 0
    finally:
        model.close()


def test_a_copy_that_fails_ends_that_choice_alone():
    model = standin_model(forward=_UncopiableForward())
    try:
        records = _ended(model.submit(ChatRequest([Message("user", "hi")],
                                                  SamplingParams(max_new_tokens=4, temperature=0), n=3)))
        assert [r.finish_reason.value for r in records] == ["length", "error", "error"]
        assert records[0].completion_tokens == 4 and model.scheduler.pending == 0
    finally:
        model.close()


# --- max_tokens capped to the room the prompt leaves, the prompt rendered once ---------------------------------
@pytest.fixture
def renders(monkeypatch):
    """How many times a chat template renders a prompt."""
    count = {"n": 0}
    real = prompts._render

    def counted(*args, **kwargs):
        count["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(prompts, "_render", counted)
    return count


def test_messages_caps_max_tokens_to_the_room_and_renders_once(standin_server, renders):
    window = 8192  # the stand-in's
    nearly_full = [{"role": "user", "content": "Write a long story. " + "x" * 8000}]
    body = {"model": MODEL, "max_tokens": 64_000, "messages": nearly_full}
    reply = httpx.post(f"{standin_server}/v1/messages", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    usage = reply.json()["usage"]
    assert 0 < usage["output_tokens"] == window - usage["input_tokens"] and reply.json()["stop_reason"] == "max_tokens"
    assert renders["n"] == 1
    with httpx.stream("POST", f"{standin_server}/v1/messages", json={**body, "max_tokens": 3, "stream": True},
                      timeout=60) as streamed:
        start = next(json.loads(line[6:]) for line in streamed.iter_lines() if line.startswith("data: "))
    assert start["message"]["usage"]["input_tokens"] == usage["input_tokens"]
    too_long = [{"role": "user", "content": "x" * (window + 10)}]
    refused = httpx.post(f"{standin_server}/v1/messages", json={**body, "messages": too_long}, timeout=60)
    assert refused.status_code == 400 and str(window) in refused.json()["error"]["message"]


def test_ollama_num_ctx_caps_the_reply_and_renders_once(standin_server, renders):
    first = httpx.post(f"{standin_server}/api/chat", json={"model": MODEL, "messages": LONG, "stream": False,
                                                   "options": {"num_predict": 1}}, timeout=60).json()
    renders["n"] = 0
    capped = httpx.post(f"{standin_server}/api/chat", json={"model": MODEL, "messages": LONG, "stream": False,
                                                            "options": {"num_ctx": first["prompt_eval_count"] + 4,
                                                                        "num_predict": 100_000}}, timeout=60).json()
    assert capped["eval_count"] == 4 and capped["done_reason"] == "length" and renders["n"] == 1


def test_a_capped_reply_over_a_long_chat_trims_it_and_keeps_room():
    chat = [Message("user" if i % 2 == 0 else "assistant", f"turn {i} " + "word " * 40) for i in range(40)]
    with pytest.raises(prompts.ContextTooLong):
        prompts.build_prompt(shared_tokenizer(), chat, 1024, 64_000)
    capped = prompts.build_prompt(shared_tokenizer(), chat, 1024, 64_000, cap=True)
    assert capped.dropped_messages > 0 and 1024 // 4 <= capped.room < 1024 // 2  # a quarter kept, not more
    assert SamplingParams(max_new_tokens=64_000).resolved(capped.room).max_new_tokens == capped.room


# --- stop strings as editor autocomplete sends them ------------------------------------------------------------
CONTINUE_STOPS = ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                  "<|repo_name|>", "<|file_sep|>", "<|im_start|>", "<|im_end|>", "\n\n", "\r\n\r\n", "/src/",
                  "#- coding: utf-8", "```"]  # Continue's for Qwen2.5-Coder (AutocompleteTemplate, getStopTokens)


def test_continues_stop_strings_are_taken_where_openai_does_not_promise_four(standin_server):
    ollama = httpx.post(f"{standin_server}/api/generate", json={"model": MODEL, "prompt": "def f(", "raw": True,
                                                        "stream": False, "options": {"stop": CONTINUE_STOPS,
                                                                                     "num_predict": 4}}, timeout=60)
    assert ollama.status_code == 200, ollama.text
    legacy = httpx.post(f"{standin_server}/v1/completions", json={"prompt": "def f(", "stop": CONTINUE_STOPS,
                                                          "max_tokens": 4}, timeout=60)
    assert legacy.status_code == 200, legacy.text
    anthropic = httpx.post(f"{standin_server}/v1/messages", json={"model": MODEL, "max_tokens": 4, "messages": ASK,
                                                          "stop_sequences": CONTINUE_STOPS}, timeout=60)
    assert anthropic.status_code == 200, anthropic.text
    chat = httpx.post(f"{standin_server}/v1/chat/completions", json={"messages": ASK, "stop": CONTINUE_STOPS[:5]},
                      timeout=60)
    assert chat.status_code == 400 and "at most 4" in chat.json()["error"]["message"]  # OpenAI's documented limit
    many = httpx.post(f"{standin_server}/api/generate", timeout=60, json={
        "model": MODEL, "prompt": "x", "stream": False, "options": {"stop": [f"s{i}" for i in range(33)]}})
    assert many.status_code == 400 and "32" in many.json()["error"]  # Ollama's shape: the message alone


# --- the real model, through the official openai client --------------------------------------------------------
@pytest.mark.real_model
@pytest.mark.parametrize("kind", ["llama.cpp", "transformers"])
def test_the_openai_client_gets_n_choices_from_the_real_model(engines, settings, kind, tmp_path):
    real = engines(kind)
    with own_server(settings, real, tmp_path) as url:
        client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
        ask = dict(model=REAL_MODEL, messages=ASK, max_tokens=24)
        alone = client.chat.completions.create(**ask, temperature=0).choices[0].message.content
        greedy = client.chat.completions.create(**ask, temperature=0, n=3)
        assert [c.message.content for c in greedy.choices] == [alone] * 3  # each choice's copied KV is the prompt's
        seeded = dict(**ask, temperature=1.0, seed=4, n=3)
        whole = client.chat.completions.create(**seeded)
        texts, _ = _streamed(client.chat.completions.create(**seeded, stream=True))
        assert texts == {c.index: c.message.content for c in whole.choices}
        assert whole.usage.completion_tokens <= 3 * 24 and whole.usage.prompt_tokens < whole.usage.total_tokens
