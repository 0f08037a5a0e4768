"""Replies on their way to the page: woken by the event loop, told their place in line, and honest
about what the model could not see."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re

import httpx
import pytest
from conftest import ServerThread, held_port
from standin import NAME as MODEL, stand_in, standin_engine

from serge.chats import ChatService
from serge.engine import ChatRequest, Engine, Message, SamplingParams
from serge.engine.generation.prompting.prompts import build_prompt
from serge.settings import Settings
from serge.store import ChatStore, Database
from serge.web.app import build_app

SHORT = {"max_new_tokens": 8, "temperature": 0}
SMALL_WINDOW = 2048  # bytes, the stand-in's tokens: about 512 of a real model's


# On the stand-in model (standin.py): nothing here needs the real one.
engine = stand_in("engine")


@pytest.fixture(scope="module")
def small_engine(standin_settings):
    """A second engine: one slot, room for four to wait, and a small context window."""
    own = standin_settings.model_copy(update={"max_running": 1, "max_queue": 4})
    with standin_engine(own, context_window=SMALL_WINDOW) as engine:
        yield engine


class NoThreads(concurrent.futures.ThreadPoolExecutor):
    """An event loop's default executor that refuses work: a listener must never need a thread."""

    def submit(self, fn, /, *args, **kwargs):
        raise AssertionError(f"a listener asked the event loop for a thread (to run {fn!r})")


def listen_all(replies) -> list[list[tuple[str, object]]]:
    """Every reply's events, all listened to at once on one event loop that has no threads to lend."""

    async def main():
        asyncio.get_running_loop().set_default_executor(NoThreads())

        async def one(reply):
            return [event async for event in reply.events()]

        return await asyncio.gather(*(one(r) for r in replies))

    return asyncio.run(main())


def service_over(engine: Engine, data_dir) -> ChatService:
    database = Database(f"sqlite:///{data_dir / 'serge.db'}")
    database.migrate()
    return ChatService(ChatStore(database), engine)


def test_many_listeners_are_woken_by_their_event_loop_not_by_threads(engine, tmp_path):
    chats = service_over(engine, tmp_path)
    try:
        replies = []
        for i in range(8):
            chat = chats.create("me", settings=SHORT)
            replies.append(chats.reply("me", chat.id, f"Name a fruit, please ({i})."))
        heard = listen_all(replies)
        for reply, events in zip(replies, heard):
            kinds = [kind for kind, _ in events]
            assert kinds[-1] == "done" and kinds.count("done") == 1 and "delta" in kinds
            text = "".join(value for kind, value in events if kind == "delta")
            assert text == events[-1][1].content == chats.get("me", reply.chat_id).messages[-1].content
    finally:
        chats.close()


def test_a_waiting_reply_hears_each_new_place_in_line(small_engine, tmp_path):
    chats = service_over(small_engine, tmp_path)
    holder = small_engine.chat(MODEL, ChatRequest([Message("user", "Write a long story.")],
                                                  SamplingParams(temperature=0, max_new_tokens=96, ignore_eos=True)))
    try:
        first, second = (chats.create("me", settings=SHORT) for _ in range(2))
        ahead = chats.reply("me", first.id, "Hello?")
        behind = chats.reply("me", second.id, "Hello again?")
        assert behind.stream.queue_position == 1
        _, heard = listen_all([ahead, behind])
        kinds = [kind for kind, _ in heard]
        assert heard[:2] == [("queued", 1), ("queued", 0)], heard[:3]
        assert kinds[2] == "delta" and kinds[-1] == "done" and "queued" not in kinds[2:]
    finally:
        holder.close()
        chats.close()


def long_chat(turns: int, settings: dict = SHORT) -> dict:
    """A chat export with `turns` questions and answers, about 50 tokens each."""
    messages, parent = [], None
    for i in range(turns):
        for role, text in (("user", f"Question {i}: tell me about the valley " + "and its river " * 10),
                           ("assistant", f"Answer {i}: the valley " + "has a river that freezes " * 8)):
            messages.append({"id": f"m{len(messages)}", "parent_id": parent, "role": role, "content": text})
            parent = messages[-1]["id"]
    return {"format": "serge.chat", "version": 1, "chat": {"title": "Long", "settings": settings},
            "messages": messages}


@pytest.fixture(scope="module")
def small_server(small_engine, tmp_path_factory):
    own = Settings(data_dir=tmp_path_factory.mktemp("small-window"), models_dir=small_engine.settings.models_path)
    with ServerThread(build_app(own, small_engine), held_port()) as running, \
            httpx.Client(base_url=running.url, timeout=120) as http:
        yield http


def reply_events(http: httpx.Client, chat_id: str, content: str) -> tuple[dict, dict]:
    start = done = None
    kind = None
    with http.stream("POST", f"/api/chats/{chat_id}/messages", json={"content": content}) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("event:"):
                kind = line[6:].strip()
            elif line.startswith("data:"):
                data = json.loads(line[5:])
                start = data if kind == "start" else start
                done = data["message"] if kind == "done" else done
    return start, done


def test_a_reply_that_could_not_see_the_oldest_messages_says_how_many(small_server, small_engine):
    export = long_chat(20)
    chat = small_server.post("/api/chats/import", json=export).json()
    start, done = reply_events(small_server, chat["id"], "What did we talk about?")

    history = [Message(m["role"], m["content"]) for m in export["messages"]]
    expected = build_prompt(small_engine.model(MODEL).tokenizer, history + [Message("user", "What did we talk about?")],
                            SMALL_WINDOW, SHORT["max_new_tokens"]).dropped_messages
    assert 0 < expected < 40 and expected % 2 == 0
    assert start["dropped_messages"] == done["dropped_messages"] == expected
    saved = small_server.get(f"/api/chats/{chat['id']}").json()["messages"][-1]
    assert saved["dropped_messages"] == expected

    page = small_server.get(f"/c/{chat['id']}").text
    badges = re.findall(r'<span class="badge dropped" data-dropped="(\d+)">([^<]*)</span>', page)
    assert badges == [(str(expected), f"written without the {expected} oldest messages: "
                                      f"the chat is longer than the model&#39;s context")]


def test_a_reply_that_saw_the_whole_chat_says_nothing(small_server):
    chat = small_server.post("/api/chats", json={"settings": SHORT}).json()
    start, done = reply_events(small_server, chat["id"], "Hello!")
    assert start["dropped_messages"] == 0 and done["dropped_messages"] == 0
    assert "badge dropped" not in small_server.get(f"/c/{chat['id']}").text
