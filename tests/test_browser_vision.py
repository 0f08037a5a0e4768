"""A person sending an image to a vision model on the chat page, in Debian's Chromium (driven by Playwright),
over the tiny random LLaVA of test_vision: the chip shows the image, and the sent message its thumbnail."""

from __future__ import annotations

import pytest

from conftest import BROWSER, open_chat, own_server
from test_browser_documents import drop
from test_vision import engine, vlm_folder  # noqa: F401  (fixtures: the tiny vision model's engine)
from tiny_vlm import png

pytestmark = BROWSER

playwright_sync = pytest.importorskip("playwright.sync_api")
expect = playwright_sync.expect


@pytest.fixture(scope="module")
def server(engine, tmp_path_factory):  # noqa: F811
    with own_server(engine.settings, engine, tmp_path_factory.mktemp("browser-vision")) as url:
        yield url


def test_an_image_sent_to_a_vision_model_shows_as_a_thumbnail_in_the_message(page, server):
    open_chat(page, server, max_tokens=4)  # the random model's reply of up to 1,024 tokens is not the point
    drop(page, "photo.png", png("purple", (64, 48)), "image/png")
    chip = page.locator("#attachments .attachment img")
    expect(chip).to_have_count(1)
    box = page.get_by_label("Message")
    box.fill("What colour is this?")
    box.press("Enter")
    thumb = page.locator('[data-role="user"] img.thumb')
    expect(thumb).to_have_count(1, timeout=60_000)
    page.wait_for_function("() => { const i = document.querySelector('[data-role=\"user\"] img.thumb');"
                           " return i && i.complete && i.naturalWidth === 64; }")  # loaded, past the page's CSP
    expect(page.locator("#attachments")).to_be_hidden()
