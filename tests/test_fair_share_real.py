"""A fair share on the real models: bob, within his limits, saturates the server with four streamed requests
for n=8 choices and a 2,048-text embedding; alice's short reply and one-line embedding take a few times what
they take alone, not the length of bob's work (the scheduling itself is tested on the stand-in:
test_fair_share.py)."""

from __future__ import annotations

import logging
import threading
import time

import httpx
import pytest
from openai import OpenAI

from conftest import MODEL, ServerThread, held_port
from serge.accounts import Accounts
from serge.settings import Settings
from serge.store import AccountStore, Database
from serge.web.app import build_app

EMBEDDER = "all-minilm-l6-v2"
# The bounds, relative to alice's time alone. Her reply joins bob's batch at once, but each of its steps is then
# one of that batch's, slower than alone: at most her time alone and REPLY_STEPS of the batch's steps, times SLACK.
# Her line may wait one batch of bob's (32 texts), as long as that batch takes alone: at most SLACK times both.
REPLY_STEPS, SLACK = 8, 3.0
BOBS_TEXT = "Text number {} that bob wants embedded, among two thousand others."


@pytest.fixture(scope="module")
def site(real_settings, engines, tmp_path_factory):
    """A server over the real models with bob's and alice's keys (bob may run four streams, as in the probe)."""
    own = Settings(data_dir=tmp_path_factory.mktemp("fair-share-real"), models_dir=real_settings.models_dir,
                   torch_threads=real_settings.torch_threads, user_max_streams=4)
    database = Database(own.database)
    database.migrate()
    accounts = Accounts(AccountStore(database))
    keys = {name: accounts.create_key(accounts.add_user(name, "correct horse battery staple"), "script")[1]
            for name in ("bob", "alice")}
    database.close()
    with ServerThread(build_app(own, engines("auto")), held_port()) as running:
        yield running.url, keys


def _timed(call) -> float:
    start = time.monotonic()
    call()
    return time.monotonic() - start


@pytest.mark.real_model
def test_alices_short_reply_and_one_line_embedding_are_not_held_back_by_bob_saturating(site):
    url, keys = site
    bob, alice = (OpenAI(base_url=f"{url}/v1", api_key=keys[n], max_retries=0, timeout=300) for n in ("bob", "alice"))

    def reply() -> None:
        answer = alice.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hi."}],
                                               max_tokens=4, temperature=0)
        assert answer.choices[0].message.content

    def line() -> None:
        assert len(alice.embeddings.create(model=EMBEDDER, input="one line").data) == 1

    def batch() -> None:  # one batch of bob's embedding: what alice's line may wait for
        bob.embeddings.create(model=EMBEDDER, input=[BOBS_TEXT.format(i) for i in range(32)])

    reply(), line(), batch()  # both models loaded, warm
    reply_alone = min(_timed(reply) for _ in range(3))
    line_alone = min(_timed(line) for _ in range(3))
    batch_alone = min(_timed(batch) for _ in range(2))

    stop, started, steps = threading.Event(), threading.Semaphore(0), {i: [] for i in range(4)}

    def saturate(i: int) -> None:
        stream = bob.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Write a long story about a lighthouse, part {i}."}],
            n=8, max_tokens=1000, temperature=0.8, stream=True)
        with stream:
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    started.release()
                    if chunk.choices[0].index == 0:
                        steps[i].append(time.monotonic())  # a token of one choice: a step of the batch
                if stop.is_set():
                    break  # the connection closes: bob's choices are cancelled

    embedded: list[float] = []
    big = threading.Thread(target=lambda: embedded.append(_timed(lambda: httpx.post(
        f"{url}/v1/embeddings", json={"model": EMBEDDER, "input": [BOBS_TEXT.format(i) for i in range(2048)]},
        headers={"Authorization": f"Bearer {keys['bob']}"}, timeout=600).raise_for_status())))
    streams = [threading.Thread(target=saturate, args=(i,)) for i in range(4)]
    try:
        for t in streams:
            t.start()
        assert started.acquire(timeout=300), "bob's replies never started"
        time.sleep(2.0)  # every slot bob's, his other requests queued
        big.start()
        time.sleep(2.0)  # bob's embedding under way
        asked = time.monotonic()
        running = max(steps.values(), key=len)  # one of bob's requests that runs
        recent = [b - a for a, b in zip(running, running[1:]) if a > asked - 4.0]
        step_loaded = sorted(recent)[len(recent) // 2] if recent else float("nan")
        reply_loaded = _timed(reply)
        line_loaded = _timed(line)
        assert big.is_alive(), "bob's embedding ended before alice asked: the test proves nothing"
    finally:
        stop.set()
        for t in streams:
            t.join(timeout=300)
        big.join(timeout=600)
    print(f"\nalice alone: reply {reply_alone:.2f} s, line {line_alone:.3f} s (a batch of bob's: {batch_alone:.2f} s); "
          f"with bob saturating: reply {reply_loaded:.2f} s (a step of the batch {step_loaded:.3f} s), "
          f"line {line_loaded:.2f} s; "
          f"bob's 2,048 texts took {embedded[0] if embedded else float('nan'):.1f} s")
    assert recent, "bob's replies made no tokens while alice waited"
    assert reply_loaded <= SLACK * (reply_alone + REPLY_STEPS * step_loaded), (reply_loaded, reply_alone, step_loaded)
    assert line_loaded <= SLACK * (line_alone + batch_alone), (line_loaded, line_alone, batch_alone)


@pytest.mark.real_model
@pytest.mark.parametrize("kind", ["llama.cpp", "transformers"])
def test_greedy_replies_that_give_their_slot_back_keep_the_text_they_have_alone(engines, kind, caplog):
    """Two slots, both bob's: alice's reply takes one of them mid-reply, and bob's reply that gave it back
    continues, on each engine, to the very text it has alone."""
    from conftest import registry_for
    from serge.engine import ChatRequest, Message, SamplingParams
    from serge.engine.generation.prompting.prompts import build_prompt

    registry = registry_for(engines(kind), kind, max_running=2)
    try:
        model = registry.get(MODEL)
        scheduler = model.scheduler
        greedy = SamplingParams(temperature=0, max_new_tokens=48, ignore_eos=True).resolved(1000)
        prompts = [build_prompt(model.tokenizer, [Message("user", q)], model.context_window, 48).ids
                   for q in ("Tell me about the sea.", "Tell me about mountains.")]

        def bobs(alice: bool) -> list[str]:
            scheduler.forget_prefixes()
            streams = [scheduler.submit(ids, greedy, party="bob") for ids in prompts]
            if alice:
                deadline = time.monotonic() + 120
                while any(s.queue_position is not None for s in streams) and time.monotonic() < deadline:
                    time.sleep(0.001)  # both of bob's replies hold a slot
                with caplog.at_level(logging.INFO, "serge.engine.generation.batching.scheduler"):
                    model.submit(ChatRequest([Message("user", "Hi")], SamplingParams(temperature=0, max_new_tokens=4),
                                             party="alice")).text()
                assert any("'bob' gave back 1" in r.getMessage() for r in caplog.records), "no slot given back"
            return [s.text() for s in streams]

        alone = bobs(alice=False)
        assert bobs(alice=True) == alone
    finally:
        registry.close()
