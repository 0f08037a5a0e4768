"""A person attaching files on the chat page, and building a collection on the Knowledge page, in Debian's
Chromium (driven by Playwright), over the stand-in model and the stand-in embedder of test_chat_documents: a
dropped PDF is read and the reply lists its source; a collection is made, a PDF uploaded and indexed, then
picked with `#` in a chat, and its passage listed under the reply."""

from __future__ import annotations

import re

import pytest

import documents as files
from conftest import BROWSER, drop, own_server
from test_chat_documents import QUESTION, asked_text, documents_engine, recorder  # noqa: F401  (fixture)


pytestmark = BROWSER

playwright_sync = pytest.importorskip("playwright.sync_api")
expect = playwright_sync.expect


@pytest.fixture(scope="module")
def server(standin_settings, recorder, tmp_path_factory):
    with documents_engine(standin_settings, recorder) as (settings, engine), \
            own_server(settings, engine, tmp_path_factory.mktemp("browser-documents")) as url:
        yield url


def expect_source(page, named: str) -> None:
    """The message sent opens its chat, and the reply lists first the passage with the fact, `named`."""
    expect(page).to_have_url(re.compile(r"/c/[0-9a-f]{32}$"))
    reply = page.locator('[data-role="assistant"]').first
    expect(reply).to_have_attribute("data-status", re.compile("complete|length"), timeout=60_000)
    first = reply.locator(".sources .source").first
    expect(first).to_have_text(named)
    assert "Ottoline" in " ".join(first.get_attribute("title").split())  # the passage, on hover


def test_a_dropped_pdf_is_read_and_the_reply_lists_page_three_as_its_source(page, server, recorder):
    page.goto(server + "/")
    drop(page, "minutes.pdf", files.long_report_pdf(), "application/pdf")
    expect(page.locator("#attachments .attachment")).to_have_text(["minutes.pdf✕"])
    box = page.get_by_label("Message")
    box.fill(QUESTION)
    box.press("Enter")
    expect_source(page, "minutes.pdf, page 3")
    expect(page.locator('[data-role="user"] .attached')).to_have_text("1 file attached")
    expect(page.locator("#attachments")).to_be_hidden()
    assert "Ottoline" in asked_text(recorder)


def test_a_refused_file_says_why_and_keeps_the_message(page, server):
    page.goto(server + "/")
    drop(page, "photo.png", b"\x89PNG\r\n\x1a\n" + b"\0" * 64, "image/png")
    box = page.get_by_label("Message")
    box.fill("What is in this picture?")
    box.press("Enter")
    expect(page.locator("#status")).to_contain_text("photo.png")
    expect(box).to_have_value("What is in this picture?")


def test_a_collection_made_on_the_knowledge_page_answers_from_a_chat_with_hash_name(page, server, recorder,
                                                                                     tmp_path):
    page.goto(server + "/knowledge")
    expect(page.locator("#empty")).to_be_visible()
    page.get_by_label("Name").fill("harbour")
    page.get_by_role("button", name="Create").click()
    card = page.locator('.collection[data-name="harbour"]')
    expect(card.locator(".summary")).to_have_text("0 of 0 file(s) indexed · 0 passages")

    pdf = tmp_path / "minutes.pdf"
    pdf.write_bytes(files.long_report_pdf())
    with page.expect_file_chooser() as chooser:
        card.get_by_role("button", name="Upload files to harbour").click()
    chooser.value.set_files(str(pdf))
    row = card.locator("tr.file")
    expect(row.locator(".state")).to_have_text("indexed", timeout=60_000)
    expect(card.locator(".summary")).to_contain_text("1 of 1 file(s) indexed")
    expect(card).to_have_attribute("data-state", "ready")

    page.goto(server + "/")
    box = page.get_by_label("Message")
    box.press_sequentially("Who keeps the lighthouse? #har")
    options = page.locator("#knowledge-list .knowledge-option")
    expect(options).to_have_text(["#harbour"])
    box.press("Enter")  # picks the name; it does not send
    expect(box).to_have_value("Who keeps the lighthouse? #harbour ")
    box.press("Enter")
    expect_source(page, "minutes.pdf, page 3 · #harbour")
    assert "Ottoline" in asked_text(recorder)

    # the chat's settings list it, to tick for every reply
    page.get_by_role("button", name="Settings").click()
    expect(page.get_by_role("checkbox", name="harbour")).not_to_be_checked()
