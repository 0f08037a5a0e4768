"""A fair share of the engine: one party filling every slot, or sending thousands of texts to embed, does not
hold back another's short reply or one-line embedding (on the stand-in, whose passes are a sleep; the real
model's figures are in test_fair_share_real.py)."""

from __future__ import annotations

import logging
import threading
import time

import httpx
import pytest
import torch
from openai import OpenAI

from conftest import ServerThread, held_port
from serge.accounts import Accounts
from serge.engine import Engine, EngineMetrics, Message, SamplingParams, SchedulerLimits
from serge.engine.embeddings import BATCH, EmbeddingModel
from serge.engine.generation.prompting.prompts import build_prompt
from serge.engine.sharing.turns import Turns
from serge.settings import Settings
from serge.store import AccountStore, Database
from serge.web.app import build_app

from standin import NAME, StandInForward, shared_tokenizer, standin_model

LONG = SamplingParams(temperature=0.9, seed=5, max_new_tokens=150, ignore_eos=True).resolved(1000)
SHORT = SamplingParams(temperature=0, max_new_tokens=4).resolved(1000)


def _prompt(text: str) -> list[int]:
    return build_prompt(shared_tokenizer(), [Message("user", text)], 8192, 32).ids


def _model(max_running: int, step_s: float = 0.002, joins: int = 0):
    return standin_model("fair", reply_tokens=None, forward=StandInForward(None, step_s, joins=joins),
                         limits=SchedulerLimits(max_running=max_running))


def _running(stream, within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while stream.queue_position is not None and time.monotonic() < deadline:
        time.sleep(0.001)
    assert stream.queue_position is None


def test_another_partys_reply_runs_while_one_party_holds_every_slot():
    model = _model(max_running=4)
    try:
        bob = [model.scheduler.submit(_prompt(f"Story {i}"), LONG, n=4, party="bob") for i in range(2)]
        _running(bob[0])
        alice = model.scheduler.submit(_prompt("Hi"), SHORT, party="alice")
        alice.text()
        assert not bob[0].done, "alice's reply waited for bob's to end"
    finally:
        model.close()


def test_a_partys_queue_does_not_delay_another_partys_request():
    """One slot: bob's three requests queue; alice's, sent after them, is next in line."""
    model = _model(max_running=1)
    try:
        params = SamplingParams(temperature=0, max_new_tokens=20, ignore_eos=True).resolved(1000)
        bob = [model.scheduler.submit(_prompt(f"Story {i}"), params, party="bob") for i in range(3)]
        _running(bob[0])
        alice = model.scheduler.submit(_prompt("Hi"), SHORT, party="alice")
        assert alice.queue_position == 0
        alice.text()
        assert not bob[2].done and not bob[1].done, "alice's request waited behind bob's queue"
    finally:
        model.close()


@pytest.mark.parametrize("joins", [0, 256], ids=["passes-apart", "joined-passes"])
def test_replies_that_gave_their_slot_back_finish_with_the_texts_they_had_alone(caplog, joins):
    """Bob's sampled choices and greedy reply, made to give slots back to alice and carol mid-reply,
    end with the very texts they have when nobody else asks (with llama.cpp's joined passes too)."""
    greedy = SamplingParams(temperature=0, max_new_tokens=150, ignore_eos=True).resolved(1000)

    def bobs(others: bool):
        model = _model(max_running=4, joins=joins)
        try:
            streams = [model.scheduler.submit(_prompt("Tell a story"), LONG, n=3, party="bob"),
                       model.scheduler.submit(_prompt("Tell another"), greedy, party="bob")]
            if others:
                _running(streams[1])
                time.sleep(0.05)  # mid-reply
                for party in ("alice", "carol"):
                    model.scheduler.submit(_prompt("Hi"), SHORT, party=party).text()
                assert not streams[0].done
            for stream in streams:
                stream.text()  # to its end
            return [r.text for s in streams for r in s.records]
        finally:
            model.close()

    alone = bobs(others=False)
    with caplog.at_level(logging.INFO, "serge.engine.generation.batching.scheduler"):
        shared = bobs(others=True)
    assert any("gave back" in r.getMessage() for r in caplog.records), "no slot was given back: proves nothing"
    assert shared == alone


def test_a_party_gives_back_only_the_slots_another_needs(caplog):
    model = _model(max_running=4)
    try:
        with caplog.at_level(logging.INFO, "serge.engine.generation.batching.scheduler"):
            bob = model.scheduler.submit(_prompt("Story"), LONG, n=4, party="bob")
            _running(bob)
            model.scheduler.submit(_prompt("Hi"), SHORT, party="alice").text()
        given = [r.getMessage() for r in caplog.records if "gave back" in r.getMessage()]
        assert given == ["fair share: 'bob' gave back 1 slots to a party under its share"]
        assert not bob.done
    finally:
        model.close()


def test_a_party_alone_uses_every_slot():
    model = _model(max_running=4)
    try:
        bob = [model.scheduler.submit(_prompt(f"Story {i}"), LONG, party="bob") for i in range(4)]
        for stream in bob:
            _running(stream)
        assert not any(s.done for s in bob)
    finally:
        model.close()


# --- embeddings ---------------------------------------------------------------------------------------
class SlowEncoder:
    """A stand-in encoder: a text's vector is its length; each batch takes `step_s` and is noted with its
    texts' first token (the party's mark)."""

    vocab_size = 256

    def __init__(self, step_s: float = 0.003, fail_on: int | None = None) -> None:
        self.step_s, self.fail_on = step_s, fail_on
        self.batches: list[int] = []
        self.lock = threading.Lock()

    def ids(self, text: str, limit: int) -> list[int]:
        return list(text.encode())[:limit]

    def vectors(self, batch: list[list[int]]) -> torch.Tensor:
        time.sleep(self.step_s)
        with self.lock:
            self.batches.append(batch[0][0])
        if batch[0][0] == self.fail_on:
            raise RuntimeError("the encoder failed")
        return torch.tensor([[float(len(ids)), 1.0] for ids in batch])

    def close(self) -> None:
        pass


def _embedder(encoder: SlowEncoder) -> EmbeddingModel:
    return EmbeddingModel("embedder", encoder, 512, 2, 0.0, 0, engine="stand-in", source="tests")


def test_a_large_embedding_request_lets_another_partys_one_line_through():
    encoder = SlowEncoder()
    model = _embedder(encoder)
    texts = [f"b{i}" for i in range(2048)]
    done: dict[str, object] = {}
    bob = threading.Thread(target=lambda: done.setdefault("bob", model.embed(texts, party="bob")))
    bob.start()
    while len(encoder.batches) < 3:
        time.sleep(0.001)
    seen = len(encoder.batches)
    alice = model.embed(["a line"], party="alice")
    bob.join(timeout=60)
    assert not bob.is_alive()
    turn = encoder.batches.index(ord("a"))
    assert turn <= seen + 1, f"alice's text waited {turn - seen} of bob's batches"
    assert encoder.batches.count(ord("b")) == 2048 // BATCH
    assert alice.vectors.tolist() == [[6.0, 1.0]]
    assert done["bob"].vectors[:, 0].tolist() == [float(len(t)) for t in texts]  # each text its own vector


def test_turns_alternate_between_parties_and_keep_each_partys_order():
    turns, ran = Turns(), []

    def work(party: str, i: int) -> None:
        with turns.turn(party):
            ran.append(f"{party}{i}")

    with turns.turn("x"):  # everyone queues while x holds the model
        threads = [threading.Thread(target=work, args=(p, i)) for p, i in
                   [("b", 0), ("b", 1), ("b", 2), ("a", 0), ("a", 1), ("c", 0)]]
        for t in threads:
            t.start()
            time.sleep(0.02)  # in this order
    for t in threads:
        t.join(timeout=10)
    assert ran == ["b0", "a0", "c0", "b1", "a1", "b2"]


def test_a_failing_batch_gives_its_turn_up():
    encoder = SlowEncoder(fail_on=ord("b"))
    model = _embedder(encoder)
    with pytest.raises(RuntimeError):
        model.embed(["b"] * 100, party="bob")
    assert model.embed(["a"], party="alice").vectors.tolist() == [[1.0, 1.0]]
    assert model.pending == 0


# --- over HTTP: the user is the party ------------------------------------------------------------------
@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A server whose stand-in runs 4 replies at once, slowly, with bob's and alice's keys."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("fair-share"), models_dir=tmp_path_factory.mktemp("none"),
                        port=held_port(), default_model=NAME, max_running=4, default_embedding_model="embedder",
                        user_max_streams=8)
    database = Database(settings.database)
    database.migrate()
    accounts = Accounts(AccountStore(database))
    keys = {name: accounts.create_key(accounts.add_user(name, "correct horse battery staple"), "script")[1]
            for name in ("bob", "alice")}
    database.close()
    metrics = EngineMetrics()
    chat = standin_model(NAME, reply_tokens=None, step_s=0.01, metrics=metrics,
                         limits=SchedulerLimits.from_settings(settings))
    encoder = SlowEncoder(step_s=0.03)  # a batch outlasts a request's way through the HTTP stack
    engine = Engine(settings, backends={NAME: chat, "embedder": _embedder(encoder)})
    try:
        with ServerThread(build_app(settings, engine), settings.port) as running:
            yield running.url, keys, encoder
    finally:
        engine.close()
        chat.close()


def test_over_http_alices_short_reply_runs_while_bobs_choices_hold_every_slot(site):
    url, keys, _ = site
    bob, alice = (OpenAI(base_url=f"{url}/v1", api_key=keys[n], max_retries=0) for n in ("bob", "alice"))
    ended: dict[str, float] = {}

    def bobs(i: int) -> None:
        for _ in bob.chat.completions.create(model=NAME, messages=[{"role": "user", "content": f"Story {i}"}], n=4,
                                             max_tokens=300, stream=True):
            pass
        ended[f"bob{i}"] = time.monotonic()

    threads = [threading.Thread(target=bobs, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # bob's first four choices hold every slot
    reply = alice.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    ended["alice"] = time.monotonic()
    for t in threads:
        t.join(timeout=120)
    assert reply.choices[0].finish_reason == "length"
    assert ended["alice"] < min(ended["bob0"], ended["bob1"]), "alice's reply waited for bob's to end"


def test_over_http_alices_one_line_embedding_runs_between_bobs_batches(site):
    url, keys, encoder = site
    start = len(encoder.batches)
    bob = threading.Thread(target=lambda: httpx.post(
        f"{url}/v1/embeddings", json={"model": "embedder", "input": [f"b{i}" for i in range(2048)]},
        headers={"Authorization": f"Bearer {keys['bob']}"}, timeout=120).raise_for_status())
    bob.start()
    while len(encoder.batches) < start + 3:
        time.sleep(0.001)
    seen = len(encoder.batches)
    answer = httpx.post(f"{url}/v1/embeddings", json={"model": "embedder", "input": "a line"},
                        headers={"Authorization": f"Bearer {keys['alice']}"}, timeout=120)
    assert answer.status_code == 200, answer.text
    turn = encoder.batches.index(ord("a"), start)
    assert turn <= seen + 2, f"alice's text waited {turn - seen} of bob's batches, of {2048 // BATCH}"
    bob.join(timeout=120)
    assert encoder.batches[start:].count(ord("b")) == 2048 // BATCH


def test_on_the_page_alices_reply_runs_while_bobs_choices_hold_every_slot(site):
    """The chat page's replies (a login session, the chat service) count as their user's too."""
    from test_accounts_api import login
    from test_chats_api import send

    url, keys, _ = site
    bob = OpenAI(base_url=f"{url}/v1", api_key=keys["bob"], max_retries=0)
    ended: dict[str, float] = {}

    def bobs() -> None:
        for _ in bob.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Story"}], n=4,
                                             max_tokens=300, stream=True):
            pass
        ended["bob"] = time.monotonic()

    alice = login(url, "alice", "correct horse battery staple")
    try:
        chat = alice.post("/api/chats", json={"settings": {"max_new_tokens": 4}})
        assert chat.status_code == 201, chat.text
        thread = threading.Thread(target=bobs)
        thread.start()
        time.sleep(0.5)  # bob's four choices hold every slot
        _, done = send(alice, f"/api/chats/{chat.json()['id']}/messages", {"content": "Hi"})
        ended["alice"] = time.monotonic()
        thread.join(timeout=120)
    finally:
        alice.close()
    assert done["finish_reason"] == "length"
    assert ended["alice"] < ended["bob"], "alice's reply waited for bob's to end"
