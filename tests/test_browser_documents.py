"""A person attaching files on the chat page in Debian's Chromium (driven by Playwright), over the stand-in model
and the stand-in embedder of test_chat_documents: a dropped PDF is read, and the reply lists its source."""

from __future__ import annotations

import base64
import re

import pytest

import documents as files
from conftest import BROWSER, own_server
from test_chat_documents import QUESTION, asked_text, documents_engine, recorder  # noqa: F401  (fixture)


pytestmark = BROWSER

playwright_sync = pytest.importorskip("playwright.sync_api")
expect = playwright_sync.expect


@pytest.fixture(scope="module")
def server(standin_settings, recorder, tmp_path_factory):
    with documents_engine(standin_settings, recorder) as (settings, engine), \
            own_server(settings, engine, tmp_path_factory.mktemp("browser-documents")) as url:
        yield url


def drop(page, name: str, data: bytes, mime: str) -> None:
    """Drop a file on the message box, as a person dragging it from their desktop does."""
    transfer = page.evaluate_handle("""([name, b64, mime]) => {
        const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
        const dt = new DataTransfer();
        dt.items.add(new File([bytes], name, { type: mime }));
        return dt;
    }""", [name, base64.b64encode(data).decode(), mime])
    page.dispatch_event("#composer", "dragover", {"dataTransfer": transfer})
    page.dispatch_event("#composer", "drop", {"dataTransfer": transfer})


def test_a_dropped_pdf_is_read_and_the_reply_lists_page_three_as_its_source(page, server, recorder):
    page.goto(server + "/")
    drop(page, "minutes.pdf", files.long_report_pdf(), "application/pdf")
    expect(page.locator("#attachments .attachment")).to_have_text(["minutes.pdf✕"])
    box = page.get_by_label("Message")
    box.fill(QUESTION)
    box.press("Enter")
    expect(page).to_have_url(re.compile(r"/c/[0-9a-f]{32}$"))
    reply = page.locator('[data-role="assistant"]').first
    expect(reply).to_have_attribute("data-status", re.compile("complete|length"), timeout=60_000)
    first = reply.locator(".sources .source").first
    expect(first).to_have_text("minutes.pdf, page 3")
    assert "Ottoline" in " ".join(first.get_attribute("title").split())  # the passage, on hover
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
