"""A person signs in to Serge through a real OpenID provider's pages in Debian's Chromium, chats, and signs out
of both.

The provider is npm's oidc-provider (the OpenID-certified Node implementation, pinned in tests/oidc/package.json;
`make test` and .ci/run install it), started by the test on 127.0.0.1 with one client and one account.
"""

from __future__ import annotations

import re

import pytest
from conftest import BROWSER, free_port, held_port, own_server, start_chat
from oidc_provider import CLIENT_ID, CLIENT_SECRET, installed, oidc_provider

pytestmark = [pytest.mark.real_model, *BROWSER]

playwright_sync = pytest.importorskip("playwright.sync_api")
expect = playwright_sync.expect

if not installed():
    pytest.skip("the test OpenID provider is not installed: `npm ci --prefix tests/oidc` (make test does it)",
                allow_module_level=True)


@pytest.fixture(scope="module")
def site(settings, engine, tmp_path_factory):
    folder = tmp_path_factory.mktemp("sign-in-oidc-browser")
    serge_port = held_port()
    serge = f"http://127.0.0.1:{serge_port}"
    accounts = {"ada": {"preferred_username": "ada", "name": "Ada Lovelace", "email": "ada@example.org",
                        "email_verified": True, "groups": ["staff"]}}
    with oidc_provider(folder, free_port(), serge, accounts) as provider, \
            own_server(settings, engine, folder, port=serge_port, oidc_issuer=provider.url, oidc_client_id=CLIENT_ID,
                       oidc_client_secret=CLIENT_SECRET, oidc_provider_name="Example ID",
                       oidc_scopes="openid profile email groups") as url:
        assert url == serge
        yield url


def sign_in_at_the_provider(page, name: str) -> None:
    page.get_by_placeholder("Enter any login").fill(name)
    page.get_by_placeholder("and password").fill("any password will do")
    page.get_by_role("button", name="Sign-in").click()
    page.get_by_role("button", name="Continue").click()  # the provider asks to share the profile with Serge


def test_a_person_signs_in_through_the_providers_pages_chats_and_signs_out_of_both(page, site):
    page.goto(site + "/login?next=%2F")
    page.get_by_role("link", name="Sign in with Example ID").click()
    sign_in_at_the_provider(page, "ada")
    expect(page).to_have_url(site + "/")
    expect(page.locator("#sidebar .user-menu")).to_contain_text("Signed in as ada")
    me = page.request.get(site + "/api/me").json()
    assert (me["name"], me["email"], me["signed_in_by"], me["admin"]) == ("ada", "ada@example.org", "oidc", False)
    assert me["groups"] == ["staff"]  # from the provider's groups claim

    start_chat(page, site, "Say hello.", 8)
    reply = page.locator('[data-role="assistant"]').first
    expect(reply).to_have_attribute("data-status", re.compile("complete|length"), timeout=90_000)
    assert reply.locator(".msg-body").inner_text().strip()

    page.get_by_role("button", name="Log out").click()
    page.get_by_role("button", name="Yes, sign me out").click()  # the provider's own session ends too
    expect(page).to_have_url(re.compile(re.escape(site) + r"/login"))
    assert page.request.get(site + "/api/me").status == 401
    page.get_by_role("link", name="Sign in with Example ID").click()
    expect(page.get_by_placeholder("Enter any login")).to_be_visible()  # asked again: not signed in there either
