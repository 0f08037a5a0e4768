"""Quotas as a person meets them, in Debian's Chromium at 1280 and 390 px on the stand-in model: a refusal says
its wait in hours and minutes, the typed message stays in the box and no empty chat is left in the sidebar;
every user has a "My usage" page (and `GET /api/usage/mine`) with today's and this month's tokens and requests
against their caps, in plain words; the Users page's cap boxes carry visible labels; the Users, Usage and My
usage pages fit a phone's width and the chart's axis text stays readable there. The chat page's model picker
offers chat models only (the real models dir, with the bundled embedding model)."""

from __future__ import annotations

import re

import httpx
import pytest
from conftest import BROWSER, MODEL as REAL, ServerThread, held_port, open_chat, own_server
from standin import NAME as MODEL, stand_in
from test_accounts_api import add_user, login, serge
from test_browser import expect
from test_usage_browser import sign_in
from test_usage_quotas import HELLO, key_of

from serge.settings import Settings
from serge.web.app import build_app

settings, engine = stand_in("settings", "engine")
WIDTHS = [1280, 390]
HUMAN_WAIT = re.compile(r"in (\d+ h( \d+ min)?|\d+ min|\d+ s)$")


@pytest.fixture(scope="module")
def site(settings, engine, tmp_path_factory):
    own = Settings(data_dir=tmp_path_factory.mktemp("my-usage"), models_dir=settings.models_dir,
                   torch_threads=settings.torch_threads, port=held_port(), default_model=MODEL)
    with ServerThread(build_app(own, engine), own.port) as running:
        for name in ("alice", "bob", "carol"):
            add_user(own.data_dir, name, *(["--admin"] if name == "alice" else []))
        serge(own.data_dir, "users", "quota", "bob", "--tokens-per-day", "5")
        yield {"url": running.url, "data_dir": own.data_dir}


def fits(page, width: int) -> None:
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= width, f"{page.url} is {scroll} px wide at {width} px"


def spend(site, user: str) -> None:
    """A reply of a few tokens for `user` (none where their cap is already reached)."""
    import openai

    try:
        openai.OpenAI(base_url=f"{site['url']}/v1", api_key=key_of(site, user), max_retries=0).chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=3)
    except openai.RateLimitError:
        pass


def test_a_wait_reads_in_hours_and_minutes():
    from serge.accounts.waits import in_words

    assert [in_words(s) for s in (9, 60, 61, 3599, 3600, 86197, 3 * 86400 + 7200)] == \
        ["9 s", "1 min", "2 min", "1 h", "1 h", "23 h 57 min", "3 days 2 h"]


@BROWSER[0]
@BROWSER[1]
@pytest.mark.parametrize("width", WIDTHS)
def test_a_refused_message_stays_in_the_box_with_a_human_wait_and_leaves_no_empty_chat(site, page, width):
    url = site["url"]
    spend(site, "bob")
    sign_in(page, url, "bob")
    before = login(url, "bob").get("/api/chats").json()["data"]
    open_chat(page, url, 5)
    box = page.get_by_label("Message")
    box.fill("Hello, are you there?")
    box.press("Enter")
    status = page.locator("#status")
    expect(status).to_contain_text("Quota reached: your quota of 5 tokens a day is used up")
    assert HUMAN_WAIT.search(status.text_content().strip()), status.text_content()
    expect(box).to_have_value("Hello, are you there?")
    expect(page).to_have_url(url + "/")
    assert login(url, "bob").get("/api/chats").json()["data"] == before, "the refused message left a chat behind"
    expect(page.locator("#chat-list .chat-link")).to_have_count(len(before))
    expect(page.locator("#conversation article.msg")).to_have_count(0)


@BROWSER[0]
@BROWSER[1]
@pytest.mark.parametrize("width", WIDTHS)
def test_every_user_reads_their_usage_against_their_caps_in_plain_words(site, page, width):
    url = site["url"]
    spend(site, "bob")
    mine = login(url, "bob").get("/api/usage/mine").json()
    assert mine["user"] == "bob" and mine["today"]["cap"] == 5 and mine["today"]["tokens"] >= 5
    assert mine["today"]["requests"] >= 1 and mine["today"]["left"] == 0 and mine["month"]["cap"] is None
    assert mine["month"]["tokens"] >= mine["today"]["tokens"]
    sign_in(page, url, "bob")
    if width < 760:  # the chat list (and the account links under it) is a drawer
        expect(page.get_by_label("Message")).to_be_focused()  # the page's script is running
        page.get_by_role("button", name="Show chats").click()
        expect(page.get_by_role("link", name="My usage")).to_be_in_viewport()
    page.get_by_role("link", name="My usage").click()
    expect(page).to_have_url(url + "/usage")
    words = page.locator(".my-usage")
    expect(words).to_contain_text(f"You have used {mine['today']['tokens']:,} of your 5 tokens today (100%)")
    expect(words).to_contain_text("0 are left, and the count starts again at midnight UTC, in ")
    expect(words).to_contain_text("this month, with no cap")
    fits(page, width)


def test_my_usage_is_only_ever_the_callers_own(site):
    spend(site, "carol")
    carol = login(site["url"], "carol").get("/api/usage/mine").json()
    bob = login(site["url"], "bob").get("/api/usage/mine").json()
    assert carol["user"] == "carol" and carol["today"]["cap"] is None and carol["today"]["requests"] >= 1
    assert bob["user"] == "bob" and httpx.get(f"{site['url']}/api/usage/mine").status_code == 401


@BROWSER[0]
@BROWSER[1]
@pytest.mark.parametrize("width", WIDTHS)
def test_the_admin_pages_fit_a_phone_and_label_every_cap_box(site, page, width):
    url = site["url"]
    spend(site, "bob")
    sign_in(page, url, "alice")
    page.goto(url + "/admin/users")
    for label in ("Tokens a day", "Tokens a month", "Requests a minute"):
        boxes = page.locator("label.cap", has_text=label)
        expect(boxes.first).to_be_visible()
        assert boxes.count() == 4, label  # three users and the default
    expect(page.get_by_label("Tokens a day for bob")).to_have_value("5")
    fits(page, width)
    page.goto(url + "/admin/usage")
    expect(page.locator("table.usage-table").first).to_contain_text("bob")
    fits(page, width)
    smallest = page.evaluate("""Math.min(...[...document.querySelectorAll('.usage-chart text')]
                                .map((t) => t.getBoundingClientRect().height))""")
    assert smallest >= 10, f"the chart's axis text is {smallest:.1f} px high at {width} px"
    page.goto(url + "/usage")
    fits(page, width)


@pytest.fixture(scope="module")
def real_site(real_settings, engines, tmp_path_factory):
    with own_server(real_settings, engines("auto"), tmp_path_factory.mktemp("picker")) as url:
        yield url


@BROWSER[0]
@BROWSER[1]
@pytest.mark.real_model
@pytest.mark.parametrize("width", WIDTHS)
def test_the_model_picker_offers_no_embedding_model(real_site, page, width):
    listed = httpx.get(f"{real_site}/api/models").json()
    embedding = [m["name"] for m in listed["data"] if m["kind"] == "embedding"]
    assert embedding, "the models dir has no embedding model to leave out (make model pulls one)"
    page.goto(real_site + "/")
    offered = page.locator("#set-model option").all_text_contents()
    assert any(REAL in o for o in offered), offered
    assert not any(name in o for name in embedding for o in offered), offered


def test_without_accounts_my_usage_shows_no_caps_since_none_applies(settings, engine, tmp_path_factory):
    with own_server(settings, engine, tmp_path_factory.mktemp("no-accounts")) as url:
        assert httpx.put(f"{url}/api/quotas/default", json={"tokens_per_day": 5}).status_code == 200
        mine = httpx.get(f"{url}/api/usage/mine").json()
        assert mine["user"] == "local" and mine["today"]["cap"] is None and mine["requests_per_minute"] is None
