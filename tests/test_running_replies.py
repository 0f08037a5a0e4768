"""Replies in progress kept in the database, for several processes sharing it: two chat services (each a
process as far as the database can tell, each with its own `SharedReplies`) over one database and one
stand-in engine. A notice from the database brings a Stop to the owner at once (on PostgreSQL a NOTIFY, which
reaches another `Database` too); the owner's poll of its rows is the fallback.
No server, no real model: `test_cluster.py` has the same promises through two `serge serve` processes."""

from __future__ import annotations

import threading
import time

import pytest
from conftest import DATABASES, POSTGRES_URL, fresh_database
from standin import standin_engine

from serge.chats import ChatService
from serge.chats.replies.running import SharedReplies
from serge.chats import ChatBusy
from serge.store import AccountStore, ChatStore, Database, NewMessage
from serge.store.running import RunningStore

LEASE_S = 1.5  # long enough for the steps before the sleep on a loaded machine
ENDLESS = {"max_new_tokens": 4000, "temperature": 0}  # ~80 s at the stand-in's pace here: a Stop ends it


@pytest.fixture(scope="module")
def engine(standin_settings):
    with standin_engine(standin_settings, reply_tokens=None, step_s=0.02) as made:
        yield made


@pytest.fixture(params=DATABASES)
def db(request, tmp_path):
    made = fresh_database(f"sqlite:///{tmp_path / 'serge.db'}" if request.param == "sqlite" else POSTGRES_URL)
    yield made
    made.close()


@pytest.fixture
def two(db, engine):
    """Two chat services over one database, as two processes would be."""
    services = [ChatService(ChatStore(db), engine, shared=SharedReplies(db)) for _ in range(2)]
    yield services
    for service in services:
        service.close()


def _streaming(chats: ChatService, chat_id: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        last = chats.get("me", chat_id).messages[-1]
        if last.role == "assistant" and last.status == "streaming" and last.content:
            return
        time.sleep(0.05)
    raise AssertionError("the reply did not start streaming")


def test_a_stop_sent_to_the_other_process_stops_the_reply_and_returns_it_saved(two):
    one, other = two
    chat = one.create("me", settings=ENDLESS)
    reply = one.reply("me", chat.id, "Tell me a long story.")
    _streaming(one, chat.id)
    asked = time.monotonic()
    stopped = other.stop("me", chat.id)
    took = time.monotonic() - asked
    assert stopped is not None and stopped.id == reply.message_id
    assert stopped.status == "stopped" and stopped.content
    assert reply.wait(5) is not None and reply.finished  # the owner's reply ended, not only its record
    assert took < 5, f"the stop took {took:.2f} s"
    assert other.stop("me", chat.id) is None  # nothing runs now, in either process


def test_a_stop_reaches_the_owner_by_notice_not_by_its_poll(db, engine):
    """The owner polls its rows once a minute here: only the notice can stop its reply within the stop's wait.
    On PostgreSQL the asking process has a `Database` of its own, as another process has."""
    other_db = db if db.engine.dialect.name == "sqlite" else Database(POSTGRES_URL)
    one = ChatService(ChatStore(db), engine, shared=SharedReplies(db, poll_s=60, heartbeat_s=60))
    other = ChatService(ChatStore(other_db), engine, shared=SharedReplies(other_db, poll_s=60, heartbeat_s=60))
    try:
        chat = one.create("me", settings=ENDLESS)
        reply = one.reply("me", chat.id, "Tell me a long story.")
        _streaming(one, chat.id)
        stopped = other.stop("me", chat.id, timeout=15)
        assert stopped is not None and stopped.status == "stopped", stopped
        assert reply.wait(5) is not None and reply.finished
    finally:
        one.close()
        other.close()
        if other_db is not db:
            other_db.close()


def test_a_chat_answering_in_one_process_is_busy_in_the_other_until_it_ends(two):
    one, other = two
    chat = one.create("me", settings=ENDLESS)
    one.reply("me", chat.id, "Tell me a long story.")
    _streaming(one, chat.id)
    with pytest.raises(ChatBusy):
        other.regenerate("me", chat.id)
    with pytest.raises(ChatBusy):
        other.reply("me", chat.id, "And another?")
    assert one.stop("me", chat.id) is not None
    regenerated = other.regenerate("me", chat.id)  # free again, from either process
    _streaming(other, chat.id)
    assert one.stop("me", chat.id).id == regenerated.message_id


def test_a_process_starting_leaves_the_replies_of_the_others_streaming(two, db, engine):
    one, _ = two
    chat = one.create("me", settings=ENDLESS)
    one.reply("me", chat.id, "Tell me a long story.")
    _streaming(one, chat.id)
    third = ChatService(ChatStore(db), engine, shared=SharedReplies(db))
    try:
        assert third.recover() == 0
        assert third.get("me", chat.id).messages[-1].status == "streaming"
    finally:
        third.close()
        one.stop("me", chat.id)


def test_a_dead_process_s_reply_is_marked_interrupted_and_its_chat_freed_after_the_lease(db, engine):
    dead = RunningStore(db, "dead-process", lease_s=LEASE_S)
    chats = ChatService(ChatStore(db), engine)
    chat = chats.create("me", settings=ENDLESS)
    message = chats.store.add_message("me", chat.id, NewMessage("assistant", "half a sen", complete=False))
    assert dead.claim(chat.id, "me")
    dead.started(chat.id, message.id)
    alive = RunningStore(db, "alive-process", lease_s=LEASE_S)
    assert not alive.claim(chat.id, "me")  # the lease holds
    assert alive.beat() == 0
    time.sleep(LEASE_S + 0.2)  # the dead process renews nothing
    assert alive.beat() == 1
    assert chats.store.get_message("me", chat.id, message.id).status == "interrupted"
    assert alive.claim(chat.id, "me")


def test_a_user_s_streams_are_counted_across_processes_and_a_dead_process_s_expire(db):
    user = AccountStore(db).add_user("bob", "not a real hash", admin=False).id
    first, second = RunningStore(db, "first", lease_s=LEASE_S), RunningStore(db, "second", lease_s=LEASE_S)
    held = [first.open_stream(user, 3), second.open_stream(user, 3), first.open_stream(user, 3)]
    assert all(held)
    assert second.open_stream(user, 3) is None and first.open_stream(user, 3) is None
    second.close_stream(held[1])
    assert second.open_stream(user, 3) is not None
    time.sleep(LEASE_S + 0.2)  # neither renews: as if both had died
    assert RunningStore(db, "third", lease_s=LEASE_S).open_stream(user, 3) is not None


@pytest.mark.postgres
@pytest.mark.skipif(not POSTGRES_URL, reason="SERGE_TEST_POSTGRES_URL is not set (CI starts PostgreSQL)")
def test_streams_opened_at_once_from_two_processes_never_pass_the_limit():
    db = fresh_database(POSTGRES_URL)
    try:
        user = AccountStore(db).add_user("bob", "not a real hash", admin=False).id
        stores = [RunningStore(db, f"process-{i}", lease_s=30) for i in range(2)]
        got, start = [], threading.Barrier(8)

        def take(store):
            start.wait()
            got.append(store.open_stream(user, 3))

        threads = [threading.Thread(target=take, args=(stores[i % 2],)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert sum(1 for g in got if g) == 3 and len(got) == 8
    finally:
        db.close()
