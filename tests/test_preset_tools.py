"""Presets with tools, as a person uses them on the chat page in Debian's Chromium at 1280 and 390 px, over the
stand-in model and a real MCP server over stdio: "Save as a preset" keeps the ticked tools and "Call a tool";
picking a preset shows its system prompt and tools; a preset whose Max tokens is below what its forced tool
call needs gives the person a message in their own words (never the raw `max_tokens=40 is fewer than ...`);
and the migration that gives presets their tool choice goes down and up."""

from __future__ import annotations

import re

import httpx
import pytest

from conftest import BROWSER, own_server, set_setting
from standin import NAME
from test_browser import expect
from test_chat_tools import script

WIDTHS = [1280, 390]


@pytest.fixture(scope="module")
def server(standin_settings, standin_engine, tmp_path_factory):
    from serge.store import Database, ToolServerStore
    from serge.tools import ToolServers

    folder = tmp_path_factory.mktemp("preset-tools")
    db = Database(f"sqlite:///{folder / 'serge.db'}")
    db.migrate()
    ToolServers(ToolServerStore(db)).register("echo", command=script("echo", "echo"))
    db.close()
    with own_server(standin_settings, standin_engine, folder) as url:
        yield url


def presets(url: str) -> dict[str, dict]:
    return {p["name"]: p for p in httpx.get(url + "/api/presets").json()["data"]}


def test_a_preset_keeps_its_tools_and_tool_choice_over_the_api(server):
    made = httpx.post(server + "/api/presets", json={"name": "echoer", "model": NAME, "tools": ["echo"],
                                                     "tool_choice": "always"})
    assert made.status_code == 201, made.text
    assert (made.json()["tools"], made.json()["tool_choice"]) == (["echo"], "always")
    changed = httpx.patch(f"{server}/api/presets/{made.json()['id']}", json={"tool_choice": "first"})
    assert changed.status_code == 200 and changed.json()["tool_choice"] == "first", changed.text
    bad = httpx.post(server + "/api/presets", json={"name": "odd", "model": NAME, "tool_choice": "sometimes"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tool_choice"


@BROWSER[0]
@BROWSER[1]
@pytest.mark.parametrize("width", WIDTHS)
def test_save_as_a_preset_keeps_the_ticked_tools_and_call_a_tool_and_picking_it_shows_them(server, page, width):
    name = f"tooled-{width}"
    page.goto(server + "/")
    page.get_by_role("button", name="Settings").click()
    set_setting(page, "System prompt", "Answer like a harbour master.")
    page.get_by_label("echo").check()
    page.get_by_label("Call a tool").select_option("first")
    page.get_by_label("Preset name").fill(name)
    page.get_by_role("button", name="Save as a preset").click()
    expect(page.locator("#preset-saved")).to_contain_text(name)
    saved = presets(server)[name]
    assert (saved["tools"], saved["tool_choice"]) == (["echo"], "first"), saved
    info = page.locator("#preset-info")
    expect(info).to_contain_text("Answer like a harbour master.")

    page.goto(server + "/")  # a new chat, with nothing ticked: picking the preset says what it brings
    page.get_by_role("button", name="Settings").click()
    expect(info).to_be_hidden()
    page.get_by_label("Model").select_option(name)
    expect(info).to_be_visible()
    expect(info).to_contain_text("System prompt: “Answer like a harbour master.”")
    expect(info).to_contain_text("Tools: echo (a tool call first in every reply)")
    assert page.evaluate("document.documentElement.scrollWidth") <= width


@BROWSER[0]
@BROWSER[1]
@pytest.mark.parametrize("width", WIDTHS)
def test_a_presets_budget_too_small_for_its_forced_tool_is_said_in_the_users_words(server, page, width):
    name = f"terse-{width}"
    made = httpx.post(server + "/api/presets", json={"name": name, "model": NAME, "tools": ["echo"],
                                                     "tool_choice": "first", "settings": {"max_new_tokens": 6}})
    assert made.status_code == 201, made.text
    chat = httpx.post(server + "/api/chats", json={"model": name}).json()
    refused = httpx.post(f"{server}/api/chats/{chat['id']}/messages", json={"content": "Echo this."}, timeout=60)
    assert refused.status_code == 400, refused.text
    said = refused.json()["error"]["message"]
    assert re.fullmatch(rf"Replies here may be 6 tokens long \(the preset “{name}”\), but the tool call this chat "
                        r"asks for needs at least \d+\. Set Max tokens to \d+ or more in Settings, or set “Call a "
                        r"tool” to “when the model decides”\.", said), said
    assert "max_tokens" not in said

    page.goto(f"{server}/c/{chat['id']}")
    box = page.get_by_label("Message")
    expect(box).to_be_focused()
    box.fill("Echo this, please.")
    box.press("Enter")
    expect(page.locator("#status")).to_contain_text(f"Replies here may be 6 tokens long (the preset “{name}”)")
    assert "max_tokens" not in page.locator("#status").text_content()


def test_the_preset_tool_choice_migration_goes_down_and_up_again(database):
    from conftest import migrate_to
    from sqlalchemy import inspect

    with database.engine.begin() as connection:
        migrate_to(connection, "0015-1", down=True)  # the revision before this one
    assert "tool_choice" not in {c["name"] for c in inspect(database.engine).get_columns("presets")}
    database.migrate()
    assert "tool_choice" in {c["name"] for c in inspect(database.engine).get_columns("presets")}
