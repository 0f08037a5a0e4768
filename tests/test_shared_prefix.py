"""Agents served as one: prompts that start alike are prefilled once, on the stand-in model.

Ten agents send the same long system prompt (their tools) at once; one prefills it and the others
copy its KV (`generation/shared_prefix.py`). What the real model must show (the same greedy text alone
and batched) is tests/test_shared_prefix_real.py's.
"""

from __future__ import annotations

import logging
import time

import pytest

from serge.engine import FinishReason, Message, SamplingParams, SchedulerLimits
from serge.engine.generation.prompting.prompts import build_prompt
from serge.engine.generation.kv.shared_prefix import MIN_SHARED

from standin import StandInForward, standin_model

SYSTEM = " ".join(f"tool_{i}(path: str, depth: int) reads the file at path to the given depth." for i in range(12))
PARAMS = SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True).resolved(1000)


class CountingForward(StandInForward):
    """The stand-in, counting the tokens each prompt pass runs (by their first token's place in the prompt)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.prefilled: list[list[int]] = []  # each prefill chunk's tokens, in order

    def prefill(self, kv, tokens):
        self.prefilled.append(list(tokens))
        return super().prefill(kv, tokens)

    def run(self, kvs, chunks):
        self.prefilled += [list(chunk) for chunk in chunks if len(chunk) > 1]  # not the decodes' one token
        return super().run(kvs, chunks)


def _model(name: str, forward: StandInForward, **limits):
    limits = {"max_running": 8, "prefill_chunk": 64, **limits}
    return standin_model(name, forward=forward, limits=SchedulerLimits(**limits))


def _prompts(model, n: int) -> list[list[int]]:
    return [build_prompt(model.tokenizer, [Message("system", SYSTEM), Message("user", f"Task {i}: list the files.")],
                         model.context_window, 32).ids for i in range(n)]


def _shared(prompts: list[list[int]]) -> int:
    first = prompts[0]
    return min(next(i for i, (a, b) in enumerate(zip(first, p)) if a != b) for p in prompts[1:])


def _alone(prompt: list[int]) -> str:
    model = _model("alone", StandInForward(reply_tokens=None), prefix_cache_mb=0)
    try:
        return model.scheduler.submit(prompt, PARAMS).text()
    finally:
        model.close()


def _system_runs(forward: CountingForward, system: list[int]) -> int:
    """How many times the forward ran the start of the system prompt (its first chunk)."""
    head = system[:16]
    return sum(1 for chunk in forward.prefilled if chunk[:16] == head)


@pytest.mark.parametrize("joins", [0, 256], ids=["passes-apart", "joined-passes"])
def test_many_replies_sharing_a_long_prompt_prefix_run_it_through_the_model_once(joins, caplog):
    caplog.set_level(logging.INFO, "serge.engine.generation.kv.shared_prefix")
    forward = CountingForward(reply_tokens=None, step_s=0.002, joins=joins)
    model = _model("shared", forward)
    try:
        prompts = _prompts(model, 6)
        shared = _shared(prompts)
        assert shared > 4 * MIN_SHARED
        streams = [model.scheduler.submit(p, PARAMS) for p in prompts]
        texts = [s.text() for s in streams]
        records = [s.record for s in streams]
        snapshot = model.scheduler.metrics.snapshot()["shared"]
    finally:
        model.close()
    assert _system_runs(forward, prompts[0]) == 1
    # Only the leader's prompt and each follower's own rest went through the forward.
    assert snapshot.shared_tokens == 5 * shared
    assert sum(map(len, forward.prefilled)) == sum(map(len, prompts)) - snapshot.shared_tokens
    assert all(r.finish_reason is FinishReason.LENGTH for r in records)
    assert [r.cached_tokens for r in records] == [0] + [shared] * 5
    assert forward.room.used == 0  # every KV, the copies too, given back
    said = [r.args for r in caplog.records if r.getMessage().startswith("shared prompt prefix: ")]
    assert {tokens for tokens, _ in said} == {shared} and sum(n - 1 for _, n in said) == 5  # a line per hand-over
    assert texts == [_alone(p) for p in prompts]  # each its own KV: its own reply, as alone
    assert len(set(texts)) == len(texts)


def test_prompts_that_share_less_than_a_copy_is_worth_prefill_on_their_own():
    forward = CountingForward(reply_tokens=None)
    model = _model("short", forward)
    try:
        prompts = [build_prompt(model.tokenizer, [Message("system", "Be brief."), Message("user", f"Task {i}: list.")],
                                model.context_window, 32).ids for i in range(3)]
        assert _shared(prompts) < MIN_SHARED
        for stream in [model.scheduler.submit(p, PARAMS) for p in prompts]:
            stream.text()
        snapshot = model.scheduler.metrics.snapshot()["short"]
    finally:
        model.close()
    assert snapshot.shared_tokens == 0
    assert sum(map(len, forward.prefilled)) == sum(map(len, prompts))


def test_followers_of_a_leader_cancelled_mid_prefill_finish_on_their_own():
    forward = CountingForward(reply_tokens=None, step_s=0.01)
    model = _model("cancelled", forward, prefill_chunk=16)
    try:
        prompts = _prompts(model, 4)
        streams = [model.scheduler.submit(p, PARAMS) for p in prompts]
        deadline = time.monotonic() + 10
        while len(forward.prefilled) < 3 and time.monotonic() < deadline:  # the leader is part way through
            time.sleep(0.002)
        assert len(model.scheduler._reuse.shared) == 3  # the others wait for its prompt
        streams[0].cancel()
        deadline = time.monotonic() + 20
        while not all(s.done for s in streams) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert all(s.done for s in streams), "a follower was left waiting for a leader that left"
        texts = [s.text() for s in streams[1:]]
        assert streams[0].record.finish_reason is FinishReason.CANCELLED
        assert all(s.record.finish_reason is FinishReason.LENGTH for s in streams[1:])
        assert model.scheduler.pending == 0
        assert len(model.scheduler._reuse.shared) == 0  # none is left following a leader
    finally:
        model.close()
    assert forward.room.used == 0
    assert texts == [_alone(p) for p in prompts[1:]]


def test_a_later_agent_finds_the_shared_prefix_in_the_prefix_cache():
    forward = CountingForward(reply_tokens=None)
    model = _model("later", forward)
    try:
        prompts = _prompts(model, 4)
        for stream in [model.scheduler.submit(p, PARAMS) for p in prompts[:3]]:
            stream.text()
        before = sum(map(len, forward.prefilled))
        model.scheduler.submit(prompts[3], PARAMS).text()
        ran = sum(map(len, forward.prefilled)) - before
    finally:
        model.close()
    assert ran == len(prompts[3]) - _shared(prompts)


def test_the_prefix_cache_tells_how_much_it_would_give_without_copying():
    model = _model("told", StandInForward(reply_tokens=None))
    try:
        prompts = _prompts(model, 3)
        cache = model.scheduler._prefixes
        kv = model.scheduler.forward.new_kv()
        kv.feed(prompts[0])
        cache.store(prompts[0], kv, len(prompts[0]), None)
        for prompt in prompts + [prompts[0] + [65, 66], prompts[0][:10]]:
            hit = cache.find(prompt)
            assert cache.reusable(prompt) == (hit.length if hit is not None else 0)
            if hit is not None:
                hit.kv.release()
    finally:
        model.close()
