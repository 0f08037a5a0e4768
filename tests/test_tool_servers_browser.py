"""An admin adding an MCP server on the Tools page, and a person ticking servers in a chat's settings, in Debian's
Chromium at 1280 and 390 px over the stand-in model: a URL nothing answers at is refused in the form with why (no
secret of it shown) and nothing saved, until the admin saves it without checking; a user's panel shows such a
server as unavailable, with why, and its box cannot be ticked; a server slow to list its tools shows "Listing its
tools…" until its tools are named. Real MCP servers over streamable HTTP on 127.0.0.1 (tests/mcp_servers.py)."""

from __future__ import annotations

import httpx
import pytest

from conftest import BROWSER, free_port, own_server
from test_my_usage_browser import WIDTHS, fits
from test_tool_servers import HttpMcp

pytestmark = BROWSER

playwright_sync = pytest.importorskip("playwright.sync_api")
expect = playwright_sync.expect

SECRETS = ("PASSWORD-6", "TOKEN-6", "SECRET-6")


@pytest.fixture(scope="module")
def remote():
    with HttpMcp() as running:
        yield running


@pytest.fixture(scope="module")
def slow():
    with HttpMcp(listing_delay_s=3.0) as running:
        yield running


@pytest.fixture(scope="module")
def server(standin_settings, standin_engine, tmp_path_factory):
    with own_server(standin_settings, standin_engine, tmp_path_factory.mktemp("tool-servers-browser")) as url:
        gone = {"name": "gone", "url": f"http://127.0.0.1:{free_port()}/mcp?token=TOKEN-6", "check": False}
        assert httpx.post(url + "/api/mcp/servers", json=gone).status_code == 201
        yield url


def add_on_the_page(page, name: str, url: str, headers: str = "") -> None:
    page.get_by_label("Name", exact=True).fill(name)
    page.get_by_label("URL", exact=True).fill(url)
    page.get_by_label("Headers", exact=False).fill(headers)
    page.get_by_role("button", name="Add server").click()


@pytest.mark.parametrize("width", WIDTHS)
def test_the_admin_form_refuses_a_url_nothing_answers_at_and_saves_it_only_when_told_to(
        page, server, remote, width):
    page.goto(server + "/admin/tools")
    nowhere = f"http://someone:PASSWORD-6@127.0.0.1:{free_port()}/mcp?token=TOKEN-6"
    add_on_the_page(page, f"far{width}", nowhere, "Authorization: Bearer SECRET-6")
    alert = page.get_by_role("alert")
    expect(alert).to_contain_text(f"'far{width}' was not saved: Serge could not list its tools at "
                                  "http://someone:***@127.0.0.1:")
    expect(alert).to_contain_text("Check that the server is running and that its URL is right")
    assert not any(secret in alert.inner_text() for secret in SECRETS)
    expect(page.locator(f'tr[data-server="far{width}"]')).to_have_count(0)  # nothing saved
    expect(page.get_by_label("URL", exact=True)).to_have_value(nowhere)  # the form as typed, to fix or to keep
    fits(page, width)
    page.get_by_role("button", name="Save without checking").click()
    expect(page.get_by_role("status")).to_contain_text(f"Added far{width}")
    row = page.locator(f'tr[data-server="far{width}"]')
    expect(row).to_contain_text("could not be reached")
    assert not any(secret in row.inner_text() for secret in SECRETS)
    expect(page.get_by_role("button", name="Save without checking")).to_have_count(0)
    add_on_the_page(page, f"near{width}", f"http://127.0.0.1:{remote.port}/mcp")
    expect(page.get_by_role("status")).to_contain_text(f"Added near{width}")
    expect(page.locator(f'tr[data-server="near{width}"]')).to_contain_text("echo")
    fits(page, width)


@pytest.mark.parametrize("width", WIDTHS)
def test_a_server_that_cannot_list_its_tools_is_unavailable_in_the_chat_and_cannot_be_ticked(
        page, server, width):
    page.goto(server + "/")
    page.get_by_role("button", name="Settings").click()
    note = page.locator('.tool-names[data-server="gone"]')
    expect(note).to_contain_text("Unavailable: the tool server 'gone' could not be reached")
    assert "TOKEN-6" not in note.inner_text()
    box = page.get_by_role("checkbox", name="gone")
    expect(box).to_be_disabled()
    expect(box).not_to_be_checked()
    expect(page.get_by_role("checkbox", name="Knowledge search")).to_be_enabled()
    fits(page, width)


@pytest.mark.parametrize("width", WIDTHS)
def test_a_server_slow_to_list_its_tools_says_so_until_they_are_named(
        page, server, slow, width):
    with httpx.Client(base_url=server, timeout=60) as client:  # a server not started yet: its listing takes 3 s
        added = client.post("/api/mcp/servers", json={"name": f"slow{width}", "check": False,
                                                      "url": f"http://127.0.0.1:{slow.port}/mcp"})
        assert added.status_code == 201, added.text
    page.goto(server + "/")
    page.get_by_role("button", name="Settings").click()
    note = page.locator(f'.tool-names[data-server="slow{width}"]')
    expect(note).to_have_text("Listing its tools…")
    expect(note).to_have_attribute("aria-busy", "true")
    expect(note).to_have_text("echo, control")
    expect(note).not_to_have_attribute("aria-busy", "true")
    expect(page.get_by_role("checkbox", name=f"slow{width}")).to_be_enabled()
    fits(page, width)
