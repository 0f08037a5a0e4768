"""The chat service's own promises: a reply reads its chat once before it starts, and answers the whole
branch on screen."""

from __future__ import annotations

from standin import stand_in

from serge.chats import ChatService
from serge.store import ChatStore, Database

SHORT = {"max_new_tokens": 8, "temperature": 0}

# On the stand-in model (standin.py): nothing here needs the real one.
engine = stand_in("engine")


class CountingStore(ChatStore):
    """A real store that counts how often a whole chat is read."""

    reads = 0

    def get_chat(self, owner, chat_id):
        self.reads += 1
        return super().get_chat(owner, chat_id)


def test_a_reply_reads_its_chat_once_and_is_prompted_with_the_whole_branch(engine, tmp_path, monkeypatch):
    database = Database(f"sqlite:///{tmp_path / 'serge.db'}")
    database.migrate()
    store = CountingStore(database)
    chats = ChatService(store, engine)
    prompted = []
    chat_with = engine.chat

    def spy(model, request):
        prompted.append([(m.role, m.content) for m in request.messages])
        return chat_with(model, request)

    monkeypatch.setattr(engine, "chat", spy)
    try:
        chat = chats.create("me", settings=SHORT, system_prompt="Be brief.")
        first = chats.reply("me", chat.id, "First question?").wait()
        store.reads = 0
        chats.reply("me", chat.id, "Second question?").wait()
        assert store.reads == 1
        store.reads = 0
        chats.regenerate("me", chat.id).wait()
        assert store.reads == 1
        whole = [("system", "Be brief."), ("user", "First question?"), ("assistant", first.content),
                 ("user", "Second question?")]
        assert prompted[1] == prompted[2] == whole
    finally:
        chats.close()
