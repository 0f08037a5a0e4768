"""An admin makes a group, fills it and shares a model with it on the Groups page in Debian's Chromium (over the
stand-in model), and someone outside the group stops seeing that model until it is shared no more."""

from __future__ import annotations

from contextlib import closing

import httpx
import pytest
from conftest import BROWSER, server_of_its_own
from standin import NAME, stand_in

pytestmark = [*BROWSER]

playwright_sync = pytest.importorskip("playwright.sync_api")
expect = playwright_sync.expect

settings, engine = stand_in("settings", "engine")
server = server_of_its_own()

PASSWORDS = {"root": "root-password", "ada": "ada-password", "bo": "bo-password"}


def login(url: str, name: str) -> httpx.Client:
    client = httpx.Client(base_url=url, timeout=60)
    assert client.post("/login", data={"name": name, "password": PASSWORDS[name]}).status_code == 303
    return client


def models_of(client: httpx.Client) -> list[str]:
    return [m["id"] for m in client.get("/v1/models").json()["data"]]


def test_an_admin_shares_a_model_with_a_group_on_the_page(page, server):
    with httpx.Client(base_url=server) as local:
        assert local.post("/api/users", json={"name": "root", "password": PASSWORDS["root"]}).status_code == 201
    with closing(login(server, "root")) as root:
        for name in ("ada", "bo"):
            assert root.post("/api/users", json={"name": name, "password": PASSWORDS[name]}).status_code == 201

    page.goto(server + "/login")
    page.get_by_label("Name").fill("root")
    page.get_by_label("Password").fill(PASSWORDS["root"])
    page.get_by_role("button", name="Log in").click()
    page.goto(server + "/settings")
    page.get_by_role("link", name="Groups").click()
    page.get_by_label("New group").fill("ml-team")
    page.get_by_role("button", name="Make group").click()
    expect(page.get_by_role("status")).to_have_text("Made the group ml-team.")
    page.get_by_label("User to put in ml-team").fill("ada")
    page.get_by_role("button", name="Put the user in ml-team").click()
    expect(page.get_by_role("status")).to_have_text("ada is in ml-team.")
    page.get_by_label("Model or preset to share with ml-team").fill(NAME)
    page.get_by_role("button", name="Share it with ml-team").click()
    expect(page.get_by_role("status")).to_contain_text(f"The model {NAME} is now for ml-team")

    with closing(login(server, "ada")) as ada, closing(login(server, "bo")) as bo:
        assert NAME in models_of(ada) and NAME not in models_of(bo)
        page.get_by_role("button", name=f"Stop sharing {NAME} with ml-team").click()
        expect(page.get_by_role("status")).to_have_text(f"The model {NAME} is no longer shared with ml-team.")
        assert NAME in models_of(bo)

    page.get_by_label("User to put in ml-team").fill("nobody")
    page.get_by_role("button", name="Put the user in ml-team").click()
    expect(page.get_by_role("alert")).to_have_text("there is no user named 'nobody'")
    page.get_by_role("button", name="Remove the group ml-team").click()
    expect(page.get_by_role("cell", name="No groups yet.")).to_be_visible()
