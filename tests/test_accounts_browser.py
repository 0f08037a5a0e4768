"""An administrator's first run in Debian's Chromium: the first account, logging in, an API key, logging out."""

from __future__ import annotations

import re

import httpx
import pytest
from conftest import BROWSER, server_of_its_own
from test_browser import expect


pytestmark = [pytest.mark.real_model, *BROWSER]


server = server_of_its_own()


def test_the_first_account_a_login_a_key_shown_once_and_a_logout(page, server):  # noqa: F811
    page.goto(server + "/")
    expect(page.get_by_text("No login (this machine)")).to_be_visible()
    page.get_by_role("link", name="Accounts").click()
    page.get_by_label("Name").fill("ada")
    page.get_by_label("Password").fill("correct horse")
    page.get_by_role("button", name="Add user").click()
    expect(page.get_by_role("status")).to_contain_text("Added ada (admin)")

    page.goto(server + "/")
    expect(page).to_have_url(re.compile(r"/login\?next=%2F$"))
    page.get_by_label("Name").fill("ada")
    page.get_by_label("Password").fill("wrong password")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("alert")).to_have_text("Wrong name or password.")
    page.get_by_label("Password").fill("correct horse")
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(server + "/")
    expect(page.locator("#sidebar .user-menu")).to_contain_text("Signed in as ada")

    page.get_by_role("link", name="API keys").click()
    page.get_by_label("Name of the new key").fill("notebook")
    page.get_by_role("button", name="Create key").click()
    key = page.get_by_label("The new API key").input_value()
    assert key.startswith("sk-serge-")
    assert httpx.get(f"{server}/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    page.goto(server + "/settings")
    expect(page.get_by_label("The new API key")).to_have_count(0)
    expect(page.get_by_role("cell", name=key[:17] + "…")).to_be_visible()
    page.get_by_role("button", name="Revoke notebook").click()
    expect(page.get_by_role("row", name=re.compile("notebook"))).to_contain_text("revoked")
    assert httpx.get(f"{server}/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 401

    page.get_by_role("button", name="Log out").click()
    expect(page).to_have_url(server + "/login")
    page.goto(server + "/")
    expect(page).to_have_url(re.compile(r"/login\?next="))
