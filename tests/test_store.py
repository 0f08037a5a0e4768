"""The chat store on SQLite, and on PostgreSQL when SERGE_TEST_POSTGRES_URL names one (CI)."""

from __future__ import annotations


import pytest
from sqlalchemy import inspect, text

from serge.store import ChatNotFound, ChatStore, MessageNotFound, NewMessage
from serge.store.tables import FULL_TEXT_COLUMN, Base

@pytest.fixture
def store(database):
    return ChatStore(database)


def _turn(store: ChatStore, chat_id: str, question: str, answer: str):
    user = store.add_message("me", chat_id, NewMessage("user", question))
    reply = store.add_message("me", chat_id, NewMessage("assistant", "", complete=False))
    store.finish_message("me", reply.id, content=answer, finish_reason="stop", complete=True, completion_tokens=3)
    return user, reply


def _head() -> str:
    """The newest migration, as Alembic reads the chain (one head: a fork would be an error here)."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from serge.store.db import MIGRATIONS

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return ScriptDirectory.from_config(config).get_current_head()


def test_migrations_are_applied_once_and_again_do_nothing(store):
    store.db.migrate()
    tables = set(inspect(store.db.engine).get_table_names())
    assert {"chats", "messages", "alembic_version"} <= tables
    with store.db.engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == _head()
    for table in Base.metadata.sorted_tables:  # the migrations build what the tables say
        migrated = {c["name"] for c in inspect(store.db.engine).get_columns(table.name)} - {FULL_TEXT_COLUMN}
        assert migrated == set(table.columns.keys()), table.name


def test_chats_of_one_owner_never_reach_another(store):
    mine = store.create_chat("me", title="mine")
    store.create_chat("you", title="yours")
    _turn(store, mine.id, "secret question", "secret answer")
    assert [c.title for c in store.list_chats("me")] == ["mine"]
    assert store.list_chats("you", "secret") == []
    with pytest.raises(ChatNotFound):
        store.get_chat("you", mine.id)
    with pytest.raises(ChatNotFound):
        store.delete_chat("you", mine.id)
    with pytest.raises(ChatNotFound):
        store.add_message("you", mine.id, NewMessage("user", "hi"))
    with pytest.raises(MessageNotFound):
        store.finish_message("you", store.get_chat("me", mine.id).messages[-1].id, content="overwritten")
    assert store.get_chat("me", mine.id).messages[-1].content == "secret answer"


def test_chats_list_newest_activity_first(store):
    old = store.create_chat("me", title="old")
    store.create_chat("me", title="new")
    assert [c.title for c in store.list_chats("me")] == ["new", "old"]
    _turn(store, old.id, "back again", "hello")
    assert [c.title for c in store.list_chats("me")] == ["old", "new"]


def test_a_regenerated_reply_and_an_edited_question_stay_as_alternatives(store):
    chat = store.create_chat("me", title="t")
    q1, a1 = _turn(store, chat.id, "first", "answer one")
    second = store.add_message("me", chat.id, NewMessage("assistant", "answer two", parent_id=q1.id,
                                                         after_current=False))
    shown = store.get_chat("me", chat.id).messages
    assert [m.content for m in shown] == ["first", "answer two"]
    assert shown[1].alternatives == (a1.id, second.id)

    edited = store.add_message("me", chat.id, NewMessage("user", "first, edited", parent_id=None,
                                                         after_current=False))
    shown = store.get_chat("me", chat.id).messages
    assert [m.content for m in shown] == ["first, edited"]
    assert shown[0].alternatives == (q1.id, edited.id)

    back = store.select_branch("me", chat.id, q1.id)  # flip back: the newest reply under it returns
    assert [m.content for m in back.messages] == ["first", "answer two"]
    assert len(store.all_messages("me", chat.id)) == 4


def test_search_matches_titles_and_message_text_ignoring_case(store):
    a = store.create_chat("me", title="Holiday plans")
    b = store.create_chat("me", title="Recipes")
    _turn(store, b.id, "How long do I boil an EGG?", "About 100% of 7 minutes")
    store.create_chat("me", title="Other")
    assert [c.id for c in store.list_chats("me", "holiday")] == [a.id]
    assert [c.id for c in store.list_chats("me", "egg")] == [b.id]
    assert [c.id for c in store.list_chats("me", "100%")] == [b.id]
    assert store.list_chats("me", "50%") == []  # % is a character here, not a wildcard
    assert store.list_chats("me", "nothing like it") == []


def test_replies_left_streaming_are_marked_interrupted_and_the_chat_goes_on(store):
    chat = store.create_chat("me", title="t")
    store.add_message("me", chat.id, NewMessage("user", "tell me a story"))
    partial = store.add_message("me", chat.id, NewMessage("assistant", "", complete=False))
    store.save_text("me", partial.id, "Once upon a")
    assert store.mark_interrupted() == 1
    assert store.mark_interrupted() == 0
    shown = store.get_chat("me", chat.id).messages
    assert (shown[-1].content, shown[-1].finish_reason, shown[-1].complete) == ("Once upon a", "interrupted", False)
    _turn(store, chat.id, "go on", "a time")
    assert [m.content for m in store.get_chat("me", chat.id).messages] == [
        "tell me a story", "Once upon a", "go on", "a time"]


def test_deleting_a_chat_deletes_all_its_messages(store):
    chat = store.create_chat("me", title="t")
    q, _ = _turn(store, chat.id, "q", "a")
    store.add_message("me", chat.id, NewMessage("assistant", "b", parent_id=q.id, after_current=False))
    keep = store.create_chat("me", title="keep")
    _turn(store, keep.id, "q", "a")
    store.delete_chat("me", chat.id)
    with pytest.raises(ChatNotFound):
        store.get_chat("me", chat.id)
    with store.db.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM messages")).scalar() == 2


def test_an_import_gets_new_ids_and_keeps_every_branch(store):
    chat = store.create_chat("me", title="t", settings={"temperature": 0.2})
    q, a1 = _turn(store, chat.id, "q", "a1")
    store.add_message("me", chat.id, NewMessage("assistant", "a2", parent_id=q.id, after_current=False))
    store.select_branch("me", chat.id, a1.id)
    original = store.get_chat("me", chat.id)
    messages = [m.__dict__ for m in store.all_messages("me", chat.id)]
    copy = store.import_chat("me", {"title": "copy", "settings": original.settings}, messages, original.current_id)
    assert copy.id != chat.id and {m.id for m in copy.messages}.isdisjoint(m["id"] for m in messages)
    assert [m.content for m in copy.messages] == ["q", "a1"]
    assert len(copy.messages[1].alternatives) == 2
    assert copy.settings == {"temperature": 0.2}
