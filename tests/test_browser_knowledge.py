"""A person building a collection on the Knowledge page in Debian's Chromium (driven by Playwright), over the
stand-in model and embedder: they make it, upload a PDF with a progress bar, wait until it is indexed, then
pick it with `#` in a chat and see its passage listed under the reply."""

from __future__ import annotations

import re

import pytest

import documents as files
from conftest import BROWSER, own_server
from test_chat_documents import asked_text, documents_engine, recorder  # noqa: F401  (fixture)


pytestmark = BROWSER

playwright_sync = pytest.importorskip("playwright.sync_api")
expect = playwright_sync.expect


@pytest.fixture(scope="module")
def server(standin_settings, recorder, tmp_path_factory):
    with documents_engine(standin_settings, recorder) as (settings, engine), \
            own_server(settings, engine, tmp_path_factory.mktemp("browser-knowledge")) as url:
        yield url


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
    expect(page).to_have_url(re.compile(r"/c/[0-9a-f]{32}$"))
    reply = page.locator('[data-role="assistant"]').first
    expect(reply).to_have_attribute("data-status", re.compile("complete|length"), timeout=60_000)
    first = reply.locator(".sources .source").first
    expect(first).to_have_text("minutes.pdf, page 3 · #harbour")
    assert "Ottoline" in " ".join(first.get_attribute("title").split())
    assert "Ottoline" in asked_text(recorder)

    # the chat's settings list it, to tick for every reply
    page.get_by_role("button", name="Settings").click()
    expect(page.get_by_role("checkbox", name="harbour")).not_to_be_checked()
