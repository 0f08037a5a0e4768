"""A person making and picking presets on the chat page, in Debian's Chromium (driven by Playwright), over the
recording stand-in of test_chat_documents: a preset saved from the settings panel is a model name to the
`openai` client, and a preset picked in the model picker answers the next chat with its system prompt."""

from __future__ import annotations

import re

import httpx
import openai
import pytest

from conftest import BROWSER, own_server, set_setting
from standin import NAME
from test_chat_documents import documents_engine, recorder  # noqa: F401  (fixture)

pytestmark = BROWSER

playwright_sync = pytest.importorskip("playwright.sync_api")
expect = playwright_sync.expect

PROMPT = "You are Harbourbot. Answer in the voice of a ferry captain."


@pytest.fixture(scope="module")
def server(standin_settings, recorder, tmp_path_factory):
    with documents_engine(standin_settings, recorder) as (settings, engine), \
            own_server(settings, engine, tmp_path_factory.mktemp("browser-presets")) as url:
        yield url


def asked(recorder) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in recorder.asked[-1]]


def test_a_preset_saved_on_the_page_is_a_model_name_to_the_openai_client(page, server, recorder):
    page.goto(server + "/")
    page.get_by_role("button", name="Settings").click()
    set_setting(page, "System prompt", PROMPT)
    set_setting(page, "Max tokens", "5")
    page.get_by_label("Preset name").fill("ferry-captain")
    page.get_by_role("button", name="Save as a preset").click()
    expect(page.locator("#preset-saved")).to_contain_text("ferry-captain")
    expect(page.get_by_label("Model")).to_have_value("ferry-captain")  # the chat now uses it

    client = openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)
    assert "ferry-captain" in [m.id for m in client.models.list()]
    reply = client.chat.completions.create(model="ferry-captain", messages=[{"role": "user", "content": "Ahoy"}])
    assert asked(recorder) == [("system", PROMPT), ("user", "Ahoy")] and reply.usage.completion_tokens == 5

    # a name that is taken says so on the page
    page.get_by_role("button", name="Save as a preset").click()
    expect(page.locator("#preset-error")).to_contain_text("already a preset named 'ferry-captain'")


def test_a_preset_picked_in_the_model_picker_answers_with_its_prompt(page, server, recorder):
    made = httpx.post(server + "/api/presets", json={"name": "lighthouse", "model": NAME, "system_prompt": "Keep "
                      "the light burning.", "settings": {"max_new_tokens": 3}})
    assert made.status_code == 201, made.text
    page.goto(server + "/")
    page.get_by_role("button", name="Settings").click()
    expect(page.get_by_label("Model").locator("optgroup[label=Presets] option")).to_contain_text(
        ["lighthouse · standin"])
    page.get_by_label("Model").select_option("lighthouse")
    page.get_by_role("button", name="Close").click()
    box = page.get_by_label("Message")
    box.fill("Is the light on?")
    box.press("Enter")
    expect(page).to_have_url(re.compile(r"/c/[0-9a-f]{32}$"))
    reply = page.locator('[data-role="assistant"]').first
    expect(reply).to_have_attribute("data-status", re.compile("complete|length"), timeout=60_000)
    assert asked(recorder) == [("system", "Keep the light burning."), ("user", "Is the light on?")]
    page.reload()
    page.get_by_role("button", name="Settings").click()
    expect(page.get_by_label("Model")).to_have_value("lighthouse")  # the chat keeps the preset's name
