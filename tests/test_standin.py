"""The stand-in model keeps the promises the fast tests lean on: it is a forward like the real ones, its
logits come from each sequence's own history, and its tokenizer is one llguidance and Serge can use."""

from __future__ import annotations


import pytest
import torch

from serge.engine import ChatRequest, Message, SamplingParams
from serge.engine.generation.forward import KV, Forward
from serge.engine.generation.kv.prefix_cache import PrefixCache
from serge.engine.generation.prompting.prompts import build_prompt
from serge.engine.generation.assembler import TextAssembler

from standin import IM_END, IM_START, StandInForward, StandInKV, byte_tokenizer, next_logits

GREEDY = SamplingParams(temperature=0, max_new_tokens=40)


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


@pytest.fixture(scope="module")
def engine(standin_engine):
    return standin_engine


def _prompt(tokenizer, text: str) -> list[int]:
    return build_prompt(tokenizer, [Message("user", text)], 4096).ids


def _forward() -> StandInForward:
    forward = StandInForward(step_s=0)
    forward.prepare()
    return forward


def test_it_has_every_member_of_the_forward_protocol():
    forward, kv = _forward(), StandInKV()
    for protocol, thing in ((Forward, forward), (KV, kv)):
        members = {name for name in vars(protocol) if not name.startswith("_")}
        assert members and all(hasattr(thing, name) for name in members), protocol


def test_the_tokens_are_bytes_and_the_template_is_chatml(tokenizer):
    text = "naïve 😀 <|im_end|>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids[:-1] == list("naïve 😀 ".encode()) and ids[-1] == IM_END == tokenizer.eos_token_id
    rendered = tokenizer.decode(_prompt(tokenizer, "Hi"))
    assert rendered.startswith("<|im_start|>system\n") and rendered.endswith("<|im_start|>user\nHi<|im_end|>\n"
                                                                             "<|im_start|>assistant\n")
    assembler = TextAssembler(tokenizer)
    assert "".join([assembler.add(i) for i in ids[:-1]] + [assembler.flush()]) == "naïve 😀 "


def test_a_prefill_in_chunks_and_a_prefix_cache_hit_give_the_logits_of_one_prefill(tokenizer):
    forward, ids = _forward(), _prompt(tokenizer, "Tell me about the sea.")
    whole = forward.new_kv()
    expected = forward.prefill(whole, ids)
    chunked = forward.new_kv()
    for start in range(0, len(ids), 7):
        got = forward.prefill(chunked, ids[start : start + 7])
    assert torch.equal(got, expected)
    cache = PrefixCache(2**20)
    cache.store(ids + [100, 101], whole, len(ids), expected)
    hit = cache.find(ids[:-1] + [ids[-1]])
    assert hit.length == len(ids) and torch.equal(hit.logits, expected)
    partial = cache.find(ids[:-3] + [65, 66])
    assert partial.kv.length == len(ids) - 3 and partial.kv is not whole
    assert torch.equal(forward.prefill(partial.kv, [65, 66]), forward.prefill(forward.new_kv(), ids[:-3] + [65, 66]))


def test_a_row_of_a_batch_is_what_that_sequence_gets_alone(tokenizer):
    forward = _forward()
    kvs = [forward.new_kv() for _ in range(3)]
    for kv, text in zip(kvs, ("one", "two", "three")):
        forward.prefill(kv, _prompt(tokenizer, text))
    alone = [forward.decode([kv.copy(kv.length)], [97])[0] for kv in kvs]
    together = forward.decode(kvs, [97, 97, 97])
    assert all(torch.equal(together[i], alone[i]) for i in range(3))
    assert not torch.equal(alone[0], alone[1]), "two conversations get different logits"


def test_replies_differ_between_conversations_end_with_eos_and_go_on_when_asked_for_long(engine):
    replies = [engine.chat(None, ChatRequest([Message("user", q)],
                                             GREEDY)) for q in ("Hi", "Hello", "Tell me a long story")]
    texts = [s.text() for s in replies]
    assert texts[0] != texts[1] and all(t.strip() for t in texts)
    assert [s.record.finish_reason.value for s in replies] == ["stop", "stop", "length"]
    assert replies[0].record.completion_tokens == 24  # reply_tokens, then the end of the turn
    assert engine.chat(None, ChatRequest([Message("user", "Hi")], GREEDY)).text() == texts[0], "deterministic"


def test_logits_depend_on_history_not_on_the_object():
    a, b = StandInKV(), StandInKV()
    a.feed([IM_START, 1, 2, 10])
    b.feed([IM_START, 1])
    b.feed([2, 10])
    assert torch.equal(next_logits(a, 24), next_logits(b, 24))
