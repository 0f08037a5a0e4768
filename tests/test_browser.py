"""A person using the chat page in Debian's Chromium (driven by Playwright)."""

from __future__ import annotations

import os
import re
import time

import httpx
import pytest
from conftest import BROWSER, ServerThread, server_of_its_own, set_setting, start_chat, held_port
from test_reply_listeners import long_chat

from serge.settings import Settings
from serge.web.app import build_app

pytestmark = [pytest.mark.real_model, *BROWSER]

playwright_sync = pytest.importorskip("playwright.sync_api")
expect = playwright_sync.expect


server = server_of_its_own()


def test_a_person_chats_stops_a_reply_renames_and_finds_everything_after_reload(page, server):
    start_chat(page, server, "Say hello.", 8)
    expect(page).to_have_url(re.compile(r"/c/[0-9a-f]{32}$"))  # the chat's own address, at once
    first = page.locator('[data-role="assistant"]').first
    expect(first).to_have_attribute("data-status", re.compile("complete|length"), timeout=90_000)
    expect(first.locator(".stats")).to_contain_text("tokens/s")
    expect(page.get_by_role("button", name="Stop")).to_be_hidden()
    first_reply = first.locator(".msg-body").inner_text()
    assert first_reply.strip()

    page.get_by_role("button", name="Settings").click()
    set_setting(page, "Max tokens", "300")
    expect(page.locator("#settings-saved")).to_have_text("Saved.")
    page.get_by_role("button", name="Close").click()

    page.get_by_label("Message").fill("Write a very long story about a dragon who learns to cook.")
    page.get_by_role("button", name="Send").click()
    stop = page.get_by_role("button", name="Stop")
    expect(stop).to_be_visible()
    growing = page.locator('[data-role="assistant"]').nth(1).locator(".msg-body")
    lengths = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and len(set(lengths)) < 3:
        lengths.append(len(growing.inner_text()))
        time.sleep(0.15)
    assert len(set(lengths)) >= 3 and lengths == sorted(lengths), f"the reply did not grow live: {lengths}"
    stop.click()
    stopped = page.locator('[data-role="assistant"]').nth(1)
    expect(stopped).to_have_attribute("data-status", "stopped", timeout=30_000)
    expect(stopped).to_contain_text("stopped")
    partial = stopped.locator(".msg-body").inner_text()
    assert partial.strip()

    page.get_by_role("button", name=re.compile("^Rename")).first.click()
    title = page.get_by_label("Chat title")
    title.fill("Dragon chat")
    title.press("Enter")
    expect(page.locator("#chat-title")).to_have_text("Dragon chat")

    url = page.url
    page.reload()
    assert page.url == url
    expect(page.locator("#chat-title")).to_have_text("Dragon chat")
    expect(page.get_by_role("link", name=re.compile("Dragon chat"))).to_be_visible()
    roles = page.locator("[data-role]").evaluate_all("els => els.map(e => e.dataset.role)")
    assert roles == ["user", "assistant", "user", "assistant"]
    expect(page.locator('[data-role="user"]').first).to_have_text(re.compile("Say hello."))
    expect(page.locator('[data-role="assistant"]').first.locator(".msg-body")).to_have_text(first_reply)
    expect(page.locator('[data-role="assistant"]').nth(1).locator(".msg-body")).to_have_text(partial)
    expect(page.locator('[data-role="assistant"]').nth(1)).to_have_attribute("data-status", "stopped")
    if shot := os.environ.get("SERGE_SCREENSHOT"):  # docs/screenshot.png is made this way
        page.screenshot(path=shot)


def test_markup_in_messages_and_replies_shows_as_text(page, server):
    hostile = ('Here: <script>window.__pwned = 1</script> and <img src=x onerror="window.__pwned = 2"> '
               'and [a link](javascript:window.__pwned=3)\n\n```python\nprint("<b>bold?</b>")\n```\n')
    exported = {"chat": {"title": "<i>not italic</i>", "settings": {"max_new_tokens": 4, "temperature": 0}},
                "messages": [{"id": "q", "role": "user", "content": "Show me some HTML"},
                             {"id": "a", "parent_id": "q", "role": "assistant", "content": hostile}]}
    chat = httpx.post(f"{server}/api/chats/import", json=exported, timeout=30).json()
    page.goto(f"{server}/c/{chat['id']}")
    reply = page.locator('[data-role="assistant"] .msg-body')
    expect(reply).to_contain_text("<script>window.__pwned = 1</script>")
    expect(reply).to_contain_text('<img src=x onerror="window.__pwned = 2">')
    assert reply.locator("script, img, a[href^='javascript']").count() == 0
    expect(reply.locator("pre code")).to_contain_text('print("<b>bold?</b>")')
    expect(reply.get_by_role("button", name="Copy code")).to_be_visible()
    expect(page.locator("#chat-title")).to_have_text("<i>not italic</i>")

    # a user message with markup, sent from the page, streams and renders as text too
    page.get_by_label("Message").fill('<img src=x onerror="window.__pwned = 4">')
    page.get_by_label("Message").press("Enter")
    expect(page.locator('[data-role="assistant"]').nth(1)).to_have_attribute(
        "data-status", re.compile("complete|length"), timeout=90_000)
    expect(page.locator('[data-role="user"]').nth(1)).to_contain_text('<img src=x onerror="window.__pwned = 4">')
    assert page.locator("#conversation img").count() == 0
    assert page.evaluate("window.__pwned") is None


def test_phone_sized_screen_and_keyboard_only(browser, server):
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    page = context.new_page()
    try:
        page.goto(server + "/")
        expect(page.get_by_label("Message")).to_be_visible()
        expect(page.get_by_role("button", name="Send")).to_be_visible()
        expect(page.get_by_role("button", name="New chat")).not_to_be_in_viewport()
        page.get_by_role("button", name="Show chats").click()
        expect(page.get_by_role("button", name="New chat")).to_be_in_viewport()
        page.get_by_role("button", name="Hide chats").click()
        # the whole page fits the width: nothing scrolls sideways
        assert page.evaluate("document.documentElement.scrollWidth") <= 390

        page.get_by_label("Message").focus()
        page.keyboard.press("Shift+Enter")  # a new line, not a send
        assert page.get_by_label("Message").input_value() == "\n"
        assert page.url.rstrip("/") == server
    finally:
        context.close()


def test_regenerate_flip_versions_edit_search_and_delete(page, server):
    exported = {"chat": {"title": "Quokka questions", "settings": {"max_new_tokens": 6, "temperature": 0}},
                "messages": [{"id": "q", "role": "user", "content": "Name an animal."},
                             {"id": "a", "parent_id": "q", "role": "assistant", "content": "The original answer."}]}
    chat = httpx.post(f"{server}/api/chats/import", json=exported, timeout=30).json()
    page.goto(f"{server}/c/{chat['id']}")
    reply = page.locator('[data-role="assistant"]')
    expect(reply.locator(".msg-body")).to_have_text("The original answer.")

    page.get_by_role("button", name="Regenerate").click()
    expect(reply).to_have_attribute("data-status", re.compile("complete|length"), timeout=90_000)
    expect(reply.locator(".versions")).to_have_text(re.compile("2/2"))
    regenerated = reply.locator(".msg-body").inner_text()
    assert regenerated.strip() and regenerated != "The original answer."
    reply.get_by_role("button", name="Previous version").click()
    expect(reply.locator(".msg-body")).to_have_text("The original answer.")
    expect(reply.locator(".versions")).to_have_text(re.compile("1/2"))

    page.locator('[data-role="user"]').get_by_role("button", name="Edit").click()
    edited = page.get_by_label("Edited text")
    edited.fill("Name a fruit.")
    edited.press("Enter")
    expect(page.locator('[data-role="assistant"]')).to_have_attribute(
        "data-status", re.compile("complete|length"), timeout=90_000)
    question = page.locator('[data-role="user"]')
    expect(question.locator(".msg-body")).to_have_text("Name a fruit.")
    expect(question.locator(".versions")).to_have_text(re.compile("2/2"))

    search = page.get_by_label("Search chats")
    search.fill("quokka")
    items = page.locator("#sidebar .chat-item")
    expect(items).to_have_count(1)
    search.fill("fruit")  # message text is searched too
    expect(items).to_have_count(1)
    search.fill("no chat says this")
    expect(items).to_have_count(0)
    search.fill("")

    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Delete Quokka questions").click()
    expect(page.get_by_role("link", name=re.compile("Quokka questions"))).to_have_count(0)
    assert httpx.get(f"{server}/api/chats/{chat['id']}", timeout=30).status_code == 404


@pytest.fixture(scope="module")
def small_window_server(small_engine, tmp_path_factory):
    own = Settings(data_dir=tmp_path_factory.mktemp("browser-small"), models_dir=small_engine.settings.models_path)
    with ServerThread(build_app(own, small_engine), held_port()) as running:
        yield running.url


def test_a_reply_says_when_the_model_could_not_see_the_oldest_messages(page, small_window_server):
    chat = httpx.post(f"{small_window_server}/api/chats/import", timeout=30,
                      json=long_chat(20, {"max_new_tokens": 40, "temperature": 0})).json()
    page.goto(f"{small_window_server}/c/{chat['id']}")
    expect(page.locator(".badge.dropped")).to_have_count(0)
    page.get_by_label("Message").fill("What did we talk about?")
    page.get_by_label("Message").press("Enter")
    streaming = page.locator('[data-role="assistant"][data-status="streaming"] .badge.dropped')
    expect(streaming).to_contain_text(re.compile(r"without the \d+ oldest messages"))  # as soon as it starts
    count = streaming.get_attribute("data-dropped")
    reply = page.locator('[data-role="assistant"]').last
    expect(reply).to_have_attribute("data-status", re.compile("complete|length"), timeout=90_000)
    expect(reply.locator(".badge.dropped")).to_have_text(
        f"written without the {count} oldest messages: the chat is longer than the model's context")
    page.reload()  # the saved reply still says it
    expect(page.locator('[data-role="assistant"]').last.locator(".badge.dropped")).to_have_attribute(
        "data-dropped", count)


def test_a_page_served_by_a_draining_process_does_not_say_the_model_is_loading(page, standin_settings,
                                                                                standin_engine, tmp_path_factory):
    """Behind a balancer, a process that got SIGTERM answers `/api/health` with `draining` for a moment
    (web/server.py); the page asks again, and the next answer comes from a process that stays."""
    own = standin_settings.model_copy(update={"data_dir": tmp_path_factory.mktemp("draining"), "port": held_port()})
    app = build_app(own, standin_engine)
    with ServerThread(app, own.port) as running:
        app.state.draining = True  # as the signal handler sets it
        with page.expect_response(lambda r: r.url.endswith("/api/health")):
            page.goto(running.url)
        with page.expect_response(lambda r: r.url.endswith("/api/health"), timeout=10_000):
            pass  # the page has read the first answer and asks again
        expect(page.locator("#status")).to_be_hidden()
        app.state.draining = False
        expect(page.get_by_label("Message")).to_be_visible()
