"""A person giving the model tools on the chat page, in Debian's Chromium (driven by Playwright), over the
stand-in model steered to call: mcp-server-time ticked in the chat's settings, the call and its result folded
in the reply as it happens and still there after a reload; a tool that writes waits for Allow or Deny."""

from __future__ import annotations

import re

import pytest

from conftest import BROWSER, own_server, set_setting
from test_chat_tools import script

pytestmark = BROWSER

playwright_sync = pytest.importorskip("playwright.sync_api")
expect = playwright_sync.expect


@pytest.fixture(scope="module")
def server(standin_settings, standin_engine, tmp_path_factory):
    from serge.store import Database, ToolServerStore
    from serge.tools import ToolServers

    folder = tmp_path_factory.mktemp("browser-tools")
    db = Database(f"sqlite:///{folder / 'serge.db'}")
    db.migrate()
    registry = ToolServers(ToolServerStore(db))
    registry.register("clock", command=["python", "-m", "mcp_server_time"])
    registry.register("notes", command=script("notes", "write_note"), env={"NOTES_FILE": str(folder / "notes.txt")})
    registry.register("hang", command=script("hang", "hang"))
    db.close()
    with own_server(standin_settings, standin_engine, folder) as url:
        yield url


def ask_with_tool(page, url: str, server: str, question: str) -> None:
    page.goto(url + "/")
    page.get_by_role("button", name="Settings").click()
    set_setting(page, "Max tokens", "120")
    set_setting(page, "Temperature", "0")
    page.get_by_label(server).check()
    page.get_by_label("Call a tool").select_option("first")
    expect(page.locator(f'.tool-names[data-server="{server}"]')).not_to_be_empty()  # its tools, named
    page.get_by_role("button", name="Close").click()
    box = page.get_by_label("Message")
    box.fill(question)
    box.press("Enter")
    expect(page).to_have_url(re.compile(r"/c/[0-9a-f]{32}$"))


def test_a_ticked_clock_is_called_and_the_call_is_folded_in_the_reply_and_still_there_after_a_reload(page, server):
    ask_with_tool(page, server, "clock", "What time is it in Paris?")
    reply = page.locator('[data-role="assistant"]').first
    expect(reply).to_have_attribute("data-status", re.compile("complete|length"), timeout=60_000)
    call = reply.locator(".tool-call").first
    expect(call.locator("summary")).to_contain_text(re.compile(r"clock · (get_current_time|convert_time)"))
    expect(call).to_have_attribute("data-state", re.compile("done|error"))
    assert call.get_attribute("open") is None  # folded
    call.locator("summary").click()
    expect(call.locator(".tool-result")).not_to_be_empty()
    expect(call.locator(".tool-label")).to_have_text(["Arguments", "Result"])  # each part says what it is
    page.reload()
    again = page.locator('[data-role="assistant"]').first.locator(".tool-call").first
    expect(again.locator("summary")).to_contain_text("clock · ")
    expect(again.locator(".tool-label")).to_have_text(["Arguments", "Result"])
    expect(again.locator(".tool-result")).to_have_text(call.locator(".tool-result").text_content())


def test_a_tool_that_writes_waits_for_the_person_and_deny_is_told_to_the_model(page, server):
    ask_with_tool(page, server, "notes", "Write a note saying hello.")
    call = page.locator('[data-role="assistant"]').first.locator(".tool-call").first
    expect(call).to_have_attribute("data-state", "waiting")
    page.get_by_role("button", name="Deny").click()
    reply = page.locator('[data-role="assistant"]').first
    expect(reply).to_have_attribute("data-status", re.compile("complete|length"), timeout=60_000)
    denied = reply.locator(".tool-call").first
    expect(denied).to_have_attribute("data-state", "denied")
    expect(denied.locator(".tool-result")).to_contain_text("the user denied this call", use_inner_text=False)


def test_a_running_call_shows_how_long_it_has_run(page, server):
    ask_with_tool(page, server, "hang", "Wait for it.")
    call = page.locator('[data-role="assistant"]').first.locator(".tool-call").first
    expect(call.locator(".tool-state")).to_have_text(re.compile(r"running [2-9] s"), timeout=30_000)
    page.get_by_role("button", name="Stop").click()
    expect(page.locator('[data-role="assistant"]').first).to_have_attribute("data-status", "stopped")
