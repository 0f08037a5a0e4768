"""New users waiting for an admin (SERGE_NEW_USERS_PENDING), on a real server over the stand-in model, signed in by
a trusted proxy's header: made at their first request, able to see who they are and nothing else, until an admin
approves them with the API, the Users page or `serge users approve`."""

from __future__ import annotations

from contextlib import closing

import httpx
import pytest
from conftest import own_server
from standin import stand_in
from test_sign_in_proxy import first_account

settings, engine = stand_in("settings", "engine")

HEADER = "X-Forwarded-Email"


@pytest.fixture(scope="module")
def site(settings, engine, tmp_path_factory):
    folder = tmp_path_factory.mktemp("pending")
    first_account(folder)  # root, an admin with the password "root-password"
    with own_server(settings, engine, folder, proxy_user_header=HEADER, proxy_user_from="127.0.0.1",
                    new_users_pending=True) as url:
        yield {"url": url, "data_dir": str(folder)}


def as_(person: str) -> dict[str, str]:
    return {HEADER: f"{person}@example.org"}


def test_a_new_user_waits_sees_only_who_they_are_and_is_let_in_once_approved(site):
    url = site["url"]
    me = httpx.get(url + "/api/me", headers=as_("ada")).json()
    assert (me["name"], me["pending"]) == ("ada", True)
    refused = httpx.get(url + "/v1/models", headers=as_("ada"))
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "pending_approval"
    assert "admin's approval" in refused.json()["error"]["message"]
    chat = httpx.post(url + "/v1/chat/completions", headers=as_("ada"),
                      json={"model": "standin", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert chat.status_code == 403
    page = httpx.get(url + "/", headers={**as_("ada"), "Accept": "text/html"})
    assert page.status_code == 403 and "Waiting for approval" in page.text

    with httpx.Client(base_url=url) as root:
        assert root.post("/login", data={"name": "root", "password": "root-password"}).status_code == 303
        listed = {u["name"]: u for u in root.get("/api/users").json()["data"]}
        assert listed["ada"]["pending"] is True and listed["ada"]["signed_in_by"] == "proxy"
        users_page = root.get("/admin/users").text
        assert "waiting" in users_page and 'aria-label="Approve ada"' in users_page
        assert httpx.post(url + "/api/users/ada/approve", headers=as_("bo")).status_code == 403
        approved = root.post("/api/users/ada/approve")
        assert approved.status_code == 200 and approved.json()["pending"] is False
    assert httpx.get(url + "/v1/models", headers=as_("ada")).status_code == 200
    assert httpx.get(url + "/api/me", headers=as_("ada")).json()["pending"] is False


def test_an_admin_approves_on_the_users_page_or_with_the_cli(site, cli):
    url = site["url"]
    for person in ("cy", "dee"):
        assert httpx.get(url + "/v1/models", headers=as_(person)).status_code == 403
    listed = cli("users", "list", "--data-dir", site["data_dir"]).stdout
    assert "cy" in listed and "waiting for approval" in listed
    assert cli("users", "approve", "cy", "--data-dir", site["data_dir"]).stdout == "Approved cy: they may use Serge now.\n"
    with closing(httpx.Client(base_url=url)) as root:
        root.post("/login", data={"name": "root", "password": "root-password"})
        answer = root.post("/admin/users/dee/approve")
        assert answer.status_code == 200 and "Approved dee" in answer.text
    for person in ("cy", "dee"):
        assert httpx.get(url + "/v1/models", headers=as_(person)).status_code == 200
