"""A step's work is done once: each event loop woken at most once a pass however many of its streams have
news, yet a first token not held behind the next prompt's pass, a reply's sampler made once however long it runs, and a decode pass's rows (a view of the forward's
buffer, as llama.cpp's are) sampled before the next pass reuses it (on the stand-in model)."""

from __future__ import annotations

import asyncio
import threading
import time

import torch
from standin import VOCAB, StandInForward, shared_tokenizer, standin_model

from serge.engine import FinishReason, SamplingParams, SchedulerLimits
from serge.engine.generation.batching import batch_sampling


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


def test_eight_readers_on_one_loop_wake_it_at_most_once_a_pass():
    """Once at the end of each step, and once before each prompt pass (sending the news before it)."""
    model = standin_model("wakeups", reply_tokens=None)
    scheduler = model.scheduler
    turns, prompt_passes = [0], [0]
    inner, prefill = scheduler._turn, scheduler.forward.prefill

    def counted(*args):
        turns[0] += 1
        return inner(*args)

    def counted_prefill(*args):
        prompt_passes[0] += 1
        return prefill(*args)

    scheduler._turn = counted  # the worker looks it up each step
    scheduler.forward.prefill = counted_prefill
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
            most = turns[0] + prompt_passes[0]
            assert loop.wakeups <= most, f"{loop.wakeups} wake-ups of one loop in {turns[0]} steps and " \
                f"{prompt_passes[0]} prompt passes"
            assert loop.wakeups > 0
    finally:
        model.close()


def test_a_prompts_first_token_reaches_its_reader_before_the_next_prompts_pass_ends():
    """Two prompts prefilled in one step, after a decode: the first one's reader has its token a pass
    before the second's (not both at the step's end), and the decoding reply's token comes first."""
    pace = 0.3
    model = standin_model("first-tokens", reply_tokens=None, step_s=pace)
    params = SamplingParams(temperature=0, max_new_tokens=400, ignore_eos=True).resolved(400)
    arrived: dict[str, float] = {}

    async def first(name: str, stream) -> None:
        async for _ in stream.adeltas():
            arrived.setdefault(name, time.monotonic())
            if name != "long":
                break
        stream.cancel()

    async def run() -> None:
        long = model.scheduler.submit(_prompt(0), params)
        reading = asyncio.ensure_future(first("long", long))
        while "long" not in arrived:  # it decodes: each step is now a `pace`-long pass or more
            await asyncio.sleep(0.01)
        await asyncio.sleep(pace / 3)  # mid-pass: both prompts wait for the same next step
        start = time.monotonic()
        await asyncio.gather(first("a", model.scheduler.submit(_prompt(1), params)),
                             first("b", model.scheduler.submit(_prompt(2), params)))
        arrived["start"] = start
        long.cancel()
        await reading

    try:
        asyncio.run(run())
    finally:
        model.close()
    assert arrived["b"] - arrived["a"] > pace / 2, f"a's first token at {arrived['a'] - arrived['start']:.2f} s, " \
        f"b's at {arrived['b'] - arrived['start']:.2f} s: a's was held for b's pass"


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


class RecordingForward(StandInForward):
    """Writes down each pass: "d" a decode, "p" a prompt chunk."""

    def __init__(self, step_s: float) -> None:
        super().__init__(reply_tokens=None, step_s=step_s)
        self.log: list[str] = []

    def decode(self, kvs, tokens):
        self.log.append("d")
        return super().decode(kvs, tokens)

    def prefill(self, kv, tokens):
        self.log.append("p")
        return super().prefill(kv, tokens)


def _prompts_after_decodes(log: list[str]) -> list[int]:
    """How many prompt chunks ran in each step after its decode."""
    return [len(run) for run in "".join(log).split("d")[1:]]


def test_prompts_arriving_beside_one_reply_are_prefilled_in_one_step_and_a_few_beside_many_one_a_step():
    forward = RecordingForward(step_s=0.05)
    model = standin_model("crowd", forward=forward, limits=SchedulerLimits(max_running=16, prefill_chunk=32))
    params = SamplingParams(temperature=0, max_new_tokens=400, ignore_eos=True).resolved(400)
    streams = [model.scheduler.submit(_prompt(0), params)]
    readers = [iter(streams[0])]  # kept: a reader dropped is a client gone, its reply cancelled
    try:
        next(readers[0])  # it decodes now, a 50 ms pass a step
        streams += [model.scheduler.submit(_prompt(i), params) for i in range(1, 7)]  # within one step
        readers += [iter(stream) for stream in streams[1:]]
        assert all(next(reader) for reader in readers[1:])
        crowd_log = list(forward.log)
        # beside the seven now decoding, three prompts of a chunk each (29 tokens): one a step
        more = [model.scheduler.submit(_prompt(i), params) for i in range(7, 10)]
        streams += more
        readers += [iter(stream) for stream in more]
        assert all(next(reader) for reader in readers[-3:])
        few_log = forward.log[len(crowd_log):]
    finally:
        for stream in streams:
            stream.cancel()
        model.close()
    assert max(_prompts_after_decodes(crowd_log)) == 6, "".join(crowd_log)
    assert few_log.count("p") == 3 and max(_prompts_after_decodes(few_log)) == 1, "".join(few_log)


class JoiningForward(StandInForward):
    """A forward that `joins`: writes down each pass, "d" a decode, "p" a prompt chunk apart, and
    (decodes, prompt chunks) for a joined one; `fail_runs`: every joined pass raises, as a bad chunk would."""

    def __init__(self, joins: int, fail_runs: bool = False) -> None:
        super().__init__(reply_tokens=None, step_s=0.02, joins=joins)
        self.log: list = []
        self.fail_runs = fail_runs

    def decode(self, kvs, tokens):
        self.log.append("d")
        return super().decode(kvs, tokens)

    def prefill(self, kv, tokens):
        self.log.append("p")
        if self.fail_runs and len(self.log) > 1 and self.log.count("p") == 3:
            raise RuntimeError("this prompt's chunk broke")
        return super().prefill(kv, tokens)

    def run(self, kvs, chunks):
        if self.fail_runs:
            raise RuntimeError("a joined pass broke")
        self.log.append((sum(len(c) == 1 for c in chunks), sum(len(c) > 1 for c in chunks)))
        return super().run(kvs, chunks)


def _crowd(forward) -> tuple[list[str | None], list]:
    """One reply decoding, then six prompts arriving at once beside it; each reply's text (None: it failed)."""
    params = SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True).resolved(12)
    model = standin_model("joins", forward=forward, limits=SchedulerLimits(max_running=16, prefill_chunk=32))
    try:
        first = iter(model.scheduler.submit(_prompt(0), params))
        head = next(first)
        streams = [model.scheduler.submit(_prompt(i), params) for i in range(1, 7)]
        texts = [head + "".join(first)]
        for stream in streams:
            text = stream.text()
            texts.append(None if stream.record.finish_reason is FinishReason.ERROR else text)
    finally:
        model.close()
    return texts, forward.log


def test_a_forward_that_joins_runs_decodes_and_prompt_chunks_in_shared_passes_with_the_texts_of_passes_apart():
    apart, apart_log = _crowd(JoiningForward(joins=0))
    joined, log = _crowd(JoiningForward(joins=64))  # the stand-in refuses a pass of more prompt tokens
    assert joined == apart and None not in joined
    assert "p" not in log and "p" in apart_log
    assert any(decodes and prompts >= 2 for decodes, prompts in (entry for entry in log if entry != "d")), log
    assert len(log) < len(apart_log)


def test_a_joined_pass_that_fails_runs_its_parts_apart_and_ends_only_the_reply_whose_chunk_broke():
    apart, _ = _crowd(JoiningForward(joins=0))
    texts, log = _crowd(JoiningForward(joins=64, fail_runs=True))
    assert texts.count(None) == 1, texts
    assert [t for t in texts if t is not None] == [t for t, u in zip(apart, texts) if u is not None]
    assert "p" in log and "d" in log  # the parts, apart
