"""Quotas and usage in Debian's Chromium, on the stand-in model: a capped user reads in the chat why their
message was refused, and the admin's Usage page shows its chart."""

from __future__ import annotations

import openai
import pytest
from conftest import BROWSER, ServerThread, start_chat, held_port
from standin import NAME as MODEL, stand_in
from test_accounts_api import PASSWORDS, add_user, serge
from test_browser import expect
from test_usage_quotas import HELLO, key_of

from serge.settings import Settings
from serge.web.app import build_app

pytestmark = [*BROWSER]
settings, engine = stand_in("settings", "engine")


@pytest.fixture(scope="module")
def site(settings, engine, tmp_path_factory):
    own = Settings(data_dir=tmp_path_factory.mktemp("usage-browser"), models_dir=settings.models_dir,
                   torch_threads=settings.torch_threads, port=held_port(), default_model=MODEL)
    with ServerThread(build_app(own, engine), own.port) as running:
        add_user(own.data_dir, "alice", "--admin")
        add_user(own.data_dir, "bob")
        yield {"url": running.url, "data_dir": own.data_dir}


def sign_in(page, url: str, name: str) -> None:
    page.goto(url + "/login")
    page.get_by_label("Name").fill(name)
    page.get_by_label("Password").fill(PASSWORDS[name])
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(url + "/")


def test_a_capped_user_reads_in_the_chat_which_quota_refused_them_and_the_admin_sees_the_chart(page, site):
    url = site["url"]
    serge(site["data_dir"], "users", "quota", "bob", "--tokens-per-day", "5")
    key = key_of(site, "bob")
    openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0).chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=3)
    sign_in(page, url, "bob")
    start_chat(page, url, "Hello?", 5)  # through the settings panel: the page's script is running
    status = page.locator("#status")
    expect(status).to_contain_text("Quota reached: your quota of 5 tokens a day is used up")
    expect(status).to_contain_text("00:00 UTC")

    page.context.clear_cookies()
    sign_in(page, url, "alice")
    page.get_by_role("link", name="Usage", exact=True).click()
    chart = page.get_by_role("img", name="Tokens per day (UTC), last 30 days")
    expect(chart).to_be_visible()
    assert chart.bounding_box()["height"] > 100
    expect(page.locator("table.usage-table").first).to_contain_text("bob")
