"""A person reading a thinking model's replies on the chat page (Debian's Chromium, driven by Playwright):
the thoughts stream live above the reply, then fold away under a line that says how long they took,
open on a click, come back after a reload, and are always text."""

from __future__ import annotations

import re
import time

import httpx
import pytest
from conftest import BROWSER, own_server, start_chat
from standin import stand_in, standin_engine

pytestmark = BROWSER

playwright_sync = pytest.importorskip("playwright.sync_api")
expect = playwright_sync.expect

# On the stand-in model (standin.py) behind a template that thinks: nothing here needs the real one.
settings = stand_in("settings")
THINK = 150  # tokens of thoughts, at 10 ms a token: long enough to watch them grow
MARKUP = '<img src=x onerror="window.pwned=1"><b>bold</b> & <script>window.pwned=2</script>'


@pytest.fixture(scope="module")
def server(settings, tmp_path_factory):
    with standin_engine(settings, think_tokens=THINK, step_s=0.01) as thinker, \
            own_server(settings, thinker, tmp_path_factory.mktemp("reasoning-page")) as url:
        yield url


def test_thoughts_stream_live_then_fold_away_open_on_a_click_and_come_back_after_a_reload(page, server):
    start_chat(page, server, "What is the capital of France?", 400)

    reply = page.locator('[data-role="assistant"]').first
    live = reply.locator(".thoughts-body")
    expect(live).to_be_visible()  # open while the model thinks
    lengths = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(set(lengths)) < 3 and not reply.locator(".msg-body").inner_text():
        lengths.append(len(live.inner_text()))
        time.sleep(0.05)
    assert len(set(lengths)) >= 3 and lengths == sorted(lengths), f"the thoughts did not grow live: {lengths}"

    expect(reply).to_have_attribute("data-status", re.compile("complete|length"), timeout=60_000)
    chat_id = page.url.rsplit("/", 1)[-1]
    saved = httpx.get(f"{server}/api/chats/{chat_id}").json()["messages"][-1]
    assert saved["reasoning"] and saved["content"]

    def folded_then_opened() -> None:
        thoughts = page.locator('[data-role="assistant"] .thoughts').first
        summary = thoughts.locator("summary")
        expect(summary).to_have_text(re.compile(rf"^Thought for {saved['reasoning_tokens']} tokens"))
        body = thoughts.locator(".thoughts-body")
        expect(body).to_be_hidden()  # folded by default
        expect(page.locator('[data-role="assistant"] .msg-body').first).to_have_text(saved["content"].strip())
        summary.click()
        expect(body).to_be_visible()
        assert body.inner_text() == saved["reasoning"].strip()
        box = thoughts.bounding_box(), page.locator('[data-role="assistant"] .msg-body').first.bounding_box()
        assert box[0]["y"] < box[1]["y"]  # above the reply's text

    folded_then_opened()
    page.reload()
    folded_then_opened()


def test_thoughts_are_shown_as_text_never_as_markup(page, server):
    chat = httpx.post(f"{server}/api/chats/import", json={"chat": {"title": "markup"}, "messages": [
        {"id": "a", "role": "user", "content": "hi"},
        {"id": "b", "parent_id": "a", "role": "assistant", "content": "hello", "reasoning": MARKUP,
         "reasoning_tokens": 9}]}).json()
    page.goto(f"{server}/c/{chat['id']}")
    thoughts = page.locator(".thoughts")
    thoughts.locator("summary").click()
    expect(thoughts.locator(".thoughts-body")).to_have_text(MARKUP)
    assert thoughts.locator("img, b, script").count() == 0
    assert page.evaluate("window.pwned") is None
