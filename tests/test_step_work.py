"""A step's work is done once: each event loop woken at most once a step however many of its streams have
news, a reply's sampler made once however long it runs, and a decode pass's rows (a view of the forward's
buffer, as llama.cpp's are) sampled before the next pass reuses it (on the stand-in model)."""

from __future__ import annotations

import asyncio
import threading

import torch
from standin import VOCAB, StandInForward, shared_tokenizer, standin_model

from serge.engine import SamplingParams, SchedulerLimits
from serge.engine.generation import batch_sampling


class CountingLoop(asyncio.SelectorEventLoop):
    """An event loop that counts the wake-ups other threads ask of it."""

    def __init__(self) -> None:
        super().__init__()
        self.wakeups = 0

    def call_soon_threadsafe(self, *args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            self.wakeups += 1
        return super().call_soon_threadsafe(*args, **kwargs)


def _prompt(i: int) -> list[int]:
    return shared_tokenizer().encode(f"<|im_start|>user\nquestion {i}<|im_end|>\n<|im_start|>assistant\n")


def test_eight_readers_on_one_loop_wake_it_at_most_once_a_step():
    model = standin_model("wakeups", reply_tokens=None)
    scheduler = model.scheduler
    turns = [0]
    inner = scheduler._turn

    def counted(*args):
        turns[0] += 1
        return inner(*args)

    scheduler._turn = counted  # the worker looks it up each step
    params = SamplingParams(temperature=0, max_new_tokens=24, ignore_eos=True).resolved(24)

    async def read(i: int) -> int:
        return len([delta async for delta in scheduler.submit(_prompt(i), params).adeltas()])

    async def all_eight() -> list[int]:
        return await asyncio.gather(*(read(i) for i in range(8)))

    try:
        with asyncio.Runner(loop_factory=CountingLoop) as runner:
            pieces = runner.run(all_eight())
            loop = runner.get_loop()
            assert all(n > 0 for n in pieces)
            assert loop.wakeups <= turns[0], f"{loop.wakeups} wake-ups of one loop in {turns[0]} steps"
            assert loop.wakeups > 0
    finally:
        model.close()


def test_a_replys_sampler_is_made_once_however_long_it_runs(monkeypatch):
    made = []
    inner = batch_sampling.Sampler.__init__

    def counted(self, params, *args, **kwargs):
        made.append(params.seed)
        inner(self, params, *args, **kwargs)

    monkeypatch.setattr(batch_sampling.Sampler, "__init__", counted)
    model = standin_model("samplers", reply_tokens=None)
    settings = [SamplingParams(temperature=0.8, top_p=0.9, seed=i, repetition_penalty=1.1, logit_bias={7: -5.0},
                               max_new_tokens=20, ignore_eos=True) for i in range(3)]
    settings.append(SamplingParams(temperature=0, seed=3, max_new_tokens=20, ignore_eos=True))
    try:
        streams = [model.scheduler.submit(_prompt(i), p.resolved(20)) for i, p in enumerate(settings)]
        records = [(s.text(), s.record)[1] for s in streams]
    finally:
        model.close()
    assert [r.completion_tokens for r in records] == [20] * 4
    assert sorted(made) == [0, 1, 2, 3], "one sampler per reply, made on its first token and kept to its last"


class BufferedForward(StandInForward):
    """Like llama.cpp's forward: decode's rows are a view of one buffer, which the next pass overwrites."""

    def __init__(self) -> None:
        super().__init__(reply_tokens=None, step_s=0.001)
        self.buffer = torch.zeros(16, VOCAB)

    def decode(self, kvs, tokens):
        rows = super().decode(kvs, tokens)
        self.buffer[: len(kvs)] = rows
        return self.buffer[: len(kvs)]

    def prefill(self, kv, tokens):
        logits = super().prefill(kv, tokens)
        self.buffer.fill_(-1.0).select(1, 0).fill_(9.0)  # what a pass leaves there: nothing the reply would pick
        return logits


def test_replies_decoded_beside_prompts_being_prefilled_are_sampled_before_the_next_pass_overwrites_their_rows():
    params = SamplingParams(temperature=0, max_new_tokens=40, ignore_eos=True).resolved(40)
    alone = standin_model("alone", reply_tokens=None)
    try:
        expected = [alone.scheduler.submit(_prompt(i), params).text() for i in range(4)]
    finally:
        alone.close()
    model = standin_model("buffered", forward=BufferedForward(),
                          limits=SchedulerLimits(max_running=8, prefill_chunk=8))
    try:
        readers, firsts = [], []
        for i in range(4):  # each prompt joins while the ones before it decode, in 8-token chunks
            readers.append(iter(model.scheduler.submit(_prompt(i), params)))
            firsts.append(next(readers[-1]))
        texts = [first + "".join(reader) for first, reader in zip(firsts, readers)]
    finally:
        model.close()
    assert texts == expected
