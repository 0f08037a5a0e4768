"""A thinking model's thoughts are kept with its reply: stored (SQLite and PostgreSQL), streamed to the page
as events of their own, in the chat API's messages, carried by export and import, and left out of the
next turn's prompt."""

from __future__ import annotations


import httpx
import pytest
from conftest import migrate_to, own_server
from sqlalchemy import text
from standin import stand_in, standin_engine
from test_chats_api import events_of

from serge.chats import MAX_MESSAGE_CHARS
from serge.store import ChatStore, NewMessage
from serge.store.tables import Base

# On the stand-in model (standin.py) behind a template that thinks: nothing here needs the real one.
settings = stand_in("settings")
THINK = 16  # tokens of thoughts before </think>
SHORT = {"max_new_tokens": 60, "temperature": 0}


@pytest.fixture(scope="module")
def engine(settings):
    with standin_engine(settings, think_tokens=THINK) as thinker:
        yield thinker


@pytest.fixture(scope="module")
def server(settings, engine, tmp_path_factory):
    with own_server(settings, engine, tmp_path_factory.mktemp("reasoning")) as url:
        yield url


def ask(client: httpx.Client, question: str = "What is the capital of France?") -> tuple[str, list]:
    chat = client.post("/api/chats", json={"settings": SHORT}).json()
    return chat["id"], events_of(client, f"/api/chats/{chat['id']}/messages", {"content": question})


# --- the chat API over a model that thinks -------------------------------------------------------
def test_a_reply_streams_its_thoughts_as_their_own_events_and_keeps_them(server):
    with httpx.Client(base_url=server, timeout=60) as client:
        chat_id, events = ask(client)
        kinds = [kind for kind, _ in events]
        assert "reasoning" in kinds and "delta" in kinds
        assert kinds.index("reasoning") < kinds.index("delta")  # the thoughts come first
        assert max(i for i, k in enumerate(kinds) if k == "reasoning") < kinds.index("delta")
        thought = "".join(data["text"] for kind, data in events if kind == "reasoning")
        answer = "".join(data["text"] for kind, data in events if kind == "delta")
        saved = events[-1][1]["message"]
        assert saved["reasoning"] == thought and saved["content"] == answer
        assert "think>" not in thought + answer
        assert THINK <= saved["reasoning_tokens"] < saved["completion_tokens"]
        shown = client.get(f"/api/chats/{chat_id}").json()["messages"][-1]
        assert (shown["reasoning"], shown["reasoning_tokens"]) == (thought, saved["reasoning_tokens"])


def test_a_reply_that_did_not_think_has_no_reasoning(server):
    with httpx.Client(base_url=server, timeout=60) as client:
        chat = client.post("/api/chats", json={"settings": SHORT}).json()
        client.post(f"/api/chats/{chat['id']}/messages", json={"content": "hi"}).read()
        chat = client.post("/api/chats/import", json={
            "chat": {"title": "plain"}, "messages": [{"id": "a", "role": "user", "content": "hi"},
                                                     {"id": "b", "parent_id": "a", "role": "assistant",
                                                      "content": "hello"}]}).json()
        reply = chat["messages"][-1]
        assert reply["reasoning"] is None and reply["reasoning_tokens"] is None


def test_earlier_thoughts_stay_out_of_the_next_prompt(server, engine):
    heard = []
    real_chat = engine.chat

    def listening(model, request):
        heard.append(list(request.messages))
        return real_chat(model, request)

    engine.chat = listening
    try:
        with httpx.Client(base_url=server, timeout=60) as client:
            chat_id, events = ask(client)
            thought = events[-1][1]["message"]["reasoning"]
            events_of(client, f"/api/chats/{chat_id}/messages", {"content": "And of Spain?"})
    finally:
        del engine.chat  # the class's own method again
    earlier = heard[-1]
    assert [m.role for m in earlier] == ["user", "assistant", "user"]
    assert thought and all(thought not in m.content for m in earlier)
    assert earlier[1].content == events[-1][1]["message"]["content"]


def test_export_and_import_carry_the_thoughts_and_an_older_export_still_imports(server):
    with httpx.Client(base_url=server, timeout=60) as client:
        chat_id, events = ask(client)
        saved = events[-1][1]["message"]
        exported = client.get(f"/api/chats/{chat_id}/export", params={"format": "json"}).json()
        reply = exported["messages"][-1]
        assert (reply["reasoning"], reply["reasoning_tokens"]) == (saved["reasoning"], saved["reasoning_tokens"])
        markdown = client.get(f"/api/chats/{chat_id}/export", params={"format": "md"}).text
        quoted = "\n".join(f"> {line}".rstrip() for line in saved["reasoning"].strip().splitlines())
        assert f"> _Thoughts:_\n{quoted}\n\n{saved['content']}" in markdown
        again = client.post("/api/chats/import", json=exported).json()["messages"][-1]
        assert (again["reasoning"], again["reasoning_tokens"]) == (saved["reasoning"], saved["reasoning_tokens"])
        assert again["content"] == saved["content"]

        for m in exported["messages"]:  # as Serge wrote exports before it kept thoughts
            del m["reasoning"], m["reasoning_tokens"]
        older = client.post("/api/chats/import", json=exported)
        assert older.status_code == 201, older.text
        assert older.json()["messages"][-1]["reasoning"] is None
        assert older.json()["messages"][-1]["content"] == saved["content"]


def test_an_import_with_thoughts_over_the_limit_is_a_400_naming_them(server):
    with httpx.Client(base_url=server, timeout=60) as client:
        answer = client.post("/api/chats/import", json={"chat": {"title": "big"}, "messages": [
            {"id": "a", "role": "user", "content": "hi"},
            {"id": "b", "parent_id": "a", "role": "assistant", "content": "hello",
             "reasoning": "x" * (MAX_MESSAGE_CHARS + 1)}]})
        assert answer.status_code == 400
        assert "messages.1.reasoning" in answer.json()["error"]["message"]


# --- the store, on SQLite and PostgreSQL ------------------------------------------------------------
def test_thoughts_saved_while_streaming_and_at_the_end_read_back(database):
    store = ChatStore(database)
    chat = store.create_chat("me", title="t")
    store.add_message("me", chat.id, NewMessage("user", "q"))
    reply = store.add_message("me", chat.id, NewMessage("assistant", "", complete=False))
    assert reply.reasoning is None
    store.save_text("me", reply.id, "", "half a thou")
    assert store.get_chat("me", chat.id).messages[-1].reasoning == "half a thou"
    store.finish_message("me", reply.id, content="Paris.", reasoning="half a thought, whole", reasoning_tokens=7,
                         finish_reason="stop", complete=True)
    shown = store.get_chat("me", chat.id).messages[-1]
    assert (shown.content, shown.reasoning, shown.reasoning_tokens) == ("Paris.", "half a thought, whole", 7)
    copied = store.import_chat("me", {"title": "copy"}, [
        {"id": "a", "role": "user", "content": "q"},
        {"id": "b", "parent_id": "a", "role": "assistant", "content": "Paris.", "reasoning": "because",
         "reasoning_tokens": 2}], None)
    assert (copied.messages[-1].reasoning, copied.messages[-1].reasoning_tokens) == ("because", 2)


def test_a_database_of_the_revision_before_keeps_its_messages_through_the_migration(database):
    with database.engine.begin() as conn:  # back to an empty database, then only as far as 0004
        Base.metadata.drop_all(conn)
        conn.execute(text("DROP TABLE IF EXISTS alembic_version"))
        migrate_to(conn, "0004")
        conn.execute(text("INSERT INTO chats (id, owner, title, settings, created_at, updated_at) "
                          "VALUES ('c1', 'me', 'old', '{}', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"))
        conn.execute(text("INSERT INTO messages (id, chat_id, role, content, complete, created_at, updated_at) "
                          "VALUES ('m1', 'c1', 'assistant', 'an old reply', true, CURRENT_TIMESTAMP, "
                          "CURRENT_TIMESTAMP)"))
        conn.execute(text("UPDATE chats SET current_id = 'm1'"))
    database.migrate()
    old = ChatStore(database).get_chat("me", "c1").messages[-1]
    assert (old.content, old.reasoning, old.reasoning_tokens) == ("an old reply", None, None)
