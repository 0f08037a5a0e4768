"""A tool call waiting for a person is a row in the database: an Allow sent to another process (or from another
tab) runs it once, a reload leaves it waiting, and every tab shows it with its buttons. Two real servers over one
database (SQLite, then PostgreSQL where CI gives one), as two processes behind a balancer would be, with a real
MCP server over stdio that writes a file; the page part in Debian's Chromium."""

from __future__ import annotations

import re
import threading
import time

import httpx
import pytest

from conftest import CHROMIUM, DATABASES, POSTGRES_URL, fresh_database, own_server
from standin import stand_in
from test_chat_tools import script
from test_chats_api import read_events

settings, engine = stand_in("settings", "engine")


@pytest.fixture(params=DATABASES)
def two(request, settings, engine, tmp_path_factory):
    """Two servers over one database; the notes they write, a line a call."""
    folder = tmp_path_factory.mktemp("decisions")
    url = f"sqlite:///{folder / 'serge.db'}" if request.param == "sqlite" else POSTGRES_URL
    from serge.store import ToolServerStore

    database = fresh_database(url)
    ToolServerStore(database).add("notes", command=script("notes", "write_note"),
                                  env={"NOTES_FILE": str(folder / "notes.txt")})
    database.close()
    with own_server(settings, engine, tmp_path_factory.mktemp("a"), database_url=url) as a, \
            own_server(settings, engine, tmp_path_factory.mktemp("b"), database_url=url) as b:
        yield a, b, folder / "notes.txt"


def notes_written(path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


def test_an_allow_sent_to_the_other_process_runs_the_waiting_call_once(two):
    a, b, notes = two
    with httpx.Client(base_url=a, timeout=120) as one, httpx.Client(base_url=b, timeout=120) as other:
        chat = one.post("/api/chats", json={"tools": ["notes"], "tool_choice": "first",
                                            "settings": {"max_new_tokens": 120, "temperature": 0}}).json()["id"]
        calls, done = [], []

        def ask():
            with one.stream("POST", f"/api/chats/{chat}/messages", json={"content": "Write a note"}) as response:
                for kind, data in read_events(response):
                    if kind == "tool":
                        calls.append(data["call"])
                    elif kind == "done":
                        done.append(data["message"])

        asking = threading.Thread(target=ask)
        asking.start()
        deadline = time.monotonic() + 60
        while not any(c["state"] == "waiting" for c in calls) and time.monotonic() < deadline:
            time.sleep(0.05)
        [waiting] = [c for c in calls if c["state"] == "waiting"]
        listed = other.get(f"/api/chats/{chat}/tool-calls").json()["data"]  # the other process, another tab
        assert [c["id"] for c in listed] == [waiting["id"]] and listed[0]["tool"] == "write_note"
        allowed = other.post(f"/api/chats/{chat}/tool-calls/{waiting['id']}", json={"allow": True})
        assert allowed.status_code == 200, allowed.text
        again = one.post(f"/api/chats/{chat}/tool-calls/{waiting['id']}", json={"allow": True})
        assert again.status_code == 409 and again.json()["error"]["code"] == "no_waiting_call"
        asking.join(60)
    assert done and done[0]["tool_calls"][0]["state"] == "done"
    assert notes_written(notes) == 1
    with httpx.Client(base_url=b, timeout=60) as other:
        assert other.get(f"/api/chats/{chat}/tool-calls").json()["data"] == []


def test_a_call_of_another_persons_chat_cannot_be_answered(two):
    a, b, notes = two
    with httpx.Client(base_url=b, timeout=60) as other:
        refused = other.post("/api/chats/" + "0" * 32 + "/tool-calls/call_x", json={"allow": True})
    assert refused.status_code == 404


@pytest.fixture(scope="module")
def site(settings, engine, tmp_path_factory):
    from serge.store import Database, ToolServerStore

    folder = tmp_path_factory.mktemp("decisions-page")
    database = Database(f"sqlite:///{folder / 'serge.db'}")
    database.migrate()
    ToolServerStore(database).add("notes", command=script("notes", "write_note"),
                                  env={"NOTES_FILE": str(folder / "notes.txt")})
    database.close()
    with own_server(settings, engine, folder) as url:
        yield url, folder / "notes.txt"


BROWSER_ONLY = [pytest.mark.browser, pytest.mark.skipif(not CHROMIUM.exists(),
                                                        reason="Debian's Chromium is not installed")]


@BROWSER_ONLY[0]
@BROWSER_ONLY[1]
def test_a_reload_leaves_the_call_waiting_and_a_second_tab_can_allow_it(browser, site):
    pytest.importorskip("playwright.sync_api")
    from playwright.sync_api import expect

    url, notes = site
    with httpx.Client(base_url=url, timeout=60) as api:
        chat = api.post("/api/chats", json={"tools": ["notes"], "tool_choice": "first",
                                            "settings": {"max_new_tokens": 120, "temperature": 0}}).json()["id"]
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{url}/c/{chat}")
    box = page.get_by_label("Message")
    box.fill("Write a note saying hello.")
    box.press("Enter")
    call = page.locator('[data-role="assistant"]').first.locator(".tool-call").first
    expect(call).to_have_attribute("data-state", "waiting", timeout=60_000)
    page.reload()  # the page sends no Stop for a reply that waits for its person
    waiting = page.locator(".tool-call[data-state=waiting]").first
    expect(waiting.get_by_role("button", name="Allow", exact=True)).to_be_visible(timeout=30_000)
    second = context.new_page()
    second.goto(f"{url}/c/{chat}")
    allow = second.locator(".tool-call[data-state=waiting]").first.get_by_role("button", name="Allow", exact=True)
    expect(allow).to_be_visible(timeout=30_000)
    allow.click()
    reply = second.locator('[data-role="assistant"]').first
    expect(reply).to_have_attribute("data-status", re.compile("complete|length"), timeout=60_000)
    expect(reply.locator(".tool-call").first).to_have_attribute("data-state", "done")
    expect(page.locator('[data-role="assistant"]').first).to_have_attribute(
        "data-status", re.compile("complete|length"), timeout=60_000)
    assert notes_written(notes) == 1
    context.close()


@BROWSER_ONLY[0]
@BROWSER_ONLY[1]
def test_always_allow_is_listed_in_the_page_and_revoked_there(browser, site):
    """An Always allow answer is kept with the chat; its settings panel lists it, Revoke makes the tool ask again;
    the API takes a shorter list, never a longer one."""
    pytest.importorskip("playwright.sync_api")
    from playwright.sync_api import expect

    url, notes = site
    with httpx.Client(base_url=url, timeout=120) as api:
        chat = api.post("/api/chats", json={"tools": ["notes"], "tool_choice": "first",
                                            "settings": {"max_new_tokens": 120, "temperature": 0}}).json()["id"]
        calls = []

        def answer_always(call):
            if call["state"] == "waiting":
                api.post(f"/api/chats/{chat}/tool-calls/{call['id']}", json={"allow": True, "always": True})

        with api.stream("POST", f"/api/chats/{chat}/messages", json={"content": "Write a note"}) as response:
            for kind, data in read_events(response):
                if kind == "tool":
                    calls.append(data["call"])
                    answer_always(data["call"])
        assert api.get(f"/api/chats/{chat}").json()["tool_approvals"] == ["notes/write_note"]
        granted = api.patch(f"/api/chats/{chat}", json={"tool_approvals": ["notes/write_note", "x/y"]})
        assert granted.status_code == 400 and granted.json()["error"]["param"] == "tool_approvals"
        page = browser.new_page()
        page.goto(f"{url}/c/{chat}")
        page.get_by_role("button", name="Settings").click()
        listed = page.locator("#always-allowed .approval")
        expect(listed).to_have_text([re.compile("notes/write_note")])
        page.get_by_role("button", name="Ask again before notes/write_note").click()
        expect(listed).to_have_count(0)
        page.close()
        assert api.get(f"/api/chats/{chat}").json()["tool_approvals"] == []


@pytest.mark.parametrize("kind", DATABASES)
def test_an_answer_wakes_the_waiting_call_by_notice_not_by_its_poll(kind, tmp_path):
    """The waiting side reads its row once a minute here: only the database's notice brings the Allow within
    the wait. On PostgreSQL the answer comes through a `Database` of its own, as from another process."""
    from serge.chats.tools import ToolDecisions
    from serge.store import Database, DecisionStore
    from serge.store.decisions import ALLOWED

    url = f"sqlite:///{tmp_path / 'serge.db'}" if kind == "sqlite" else POSTGRES_URL
    here = fresh_database(url)
    there = here if kind == "sqlite" else Database(url)
    try:
        decisions = ToolDecisions(DecisionStore(here), poll_s=60)
        decisions.store.ask("call_notice", "alice", None, "notes", "write_note", "{}")
        answering = threading.Timer(1.0, lambda: DecisionStore(there).answer("call_notice", "alice", True))
        answering.start()
        found = decisions.wait("call_notice", threading.Event(), wait_s=20)
        answering.join()
        assert found is not None and found.state == ALLOWED, found
    finally:
        if there is not here:
            there.close()
        here.close()
