"""Groups of users on a real server over the stand-in model: made and filled by an admin with `serge groups` or
`/api/groups`, seen by each person in `/api/me`, and refused to everyone else. (Groups synced from a provider's
claim: test_sign_in_oidc.py.)"""

from __future__ import annotations

import re
import shlex
from contextlib import closing
from pathlib import Path

import httpx
import pytest
from conftest import own_server
from standin import stand_in

settings, engine = stand_in("settings", "engine")

PASSWORDS = {"root": "root-password", "ada": "ada-password"}


@pytest.fixture(scope="module")
def site(settings, engine, tmp_path_factory):
    folder = tmp_path_factory.mktemp("groups")
    with own_server(settings, engine, folder) as url:
        yield {"url": url, "data_dir": str(folder)}


def serge(cli, site, *args: str, stdin: str = ""):
    return cli(*args, "--data-dir", site["data_dir"], stdin=stdin)


def login(site, name: str) -> httpx.Client:
    client = httpx.Client(base_url=site["url"], timeout=60)
    assert client.post("/login", data={"name": name, "password": PASSWORDS[name]}).status_code == 303
    return client


@pytest.fixture(scope="module")
def accounts(site):
    with httpx.Client(base_url=site["url"]) as local:  # no accounts yet: this machine makes the first (an admin)
        assert local.post("/api/users", json={"name": "root", "password": PASSWORDS["root"]}).status_code == 201
    with closing(login(site, "root")) as root:
        assert root.post("/api/users", json={"name": "ada", "password": PASSWORDS["ada"]}).status_code == 201
    return site


def test_an_admin_makes_and_fills_groups_with_the_cli_and_each_person_sees_theirs(cli, accounts):
    assert serge(cli, accounts, "groups", "add", "ml-team").stdout == "Made the group ml-team.\n"
    assert serge(cli, accounts, "groups", "join", "ml-team", "ada").stdout == "ada is in ml-team (1 member(s)).\n"
    listed = serge(cli, accounts, "groups", "list").stdout
    assert listed.split() == ["ml-team", "serge", "ada"]
    with closing(login(accounts, "ada")) as ada:
        assert ada.get("/api/me").json()["groups"] == ["ml-team"]
    assert serge(cli, accounts, "groups", "leave", "ml-team", "ada").returncode == 0
    with closing(login(accounts, "ada")) as ada:
        assert ada.get("/api/me").json()["groups"] == []
    refused = serge(cli, accounts, "groups", "add", "ml-team")
    assert refused.returncode == 2 and "already a group named 'ml-team'" in refused.stderr
    missing = serge(cli, accounts, "groups", "join", "nobody-here", "ada")
    assert missing.returncode == 2 and "no group named 'nobody-here'" in missing.stderr


def test_the_groups_api_is_for_admins_and_says_what_is_wrong(accounts):
    with closing(login(accounts, "root")) as root, closing(login(accounts, "ada")) as ada:
        made = root.post("/api/groups", json={"name": "research"})
        assert made.status_code == 201 and made.json()["members"] == [] and made.json()["source"] == "serge"
        assert root.put("/api/groups/research/members/ada").json()["members"] == ["ada"]
        assert ada.get("/api/me").json()["groups"] == ["research"]
        assert {g["name"] for g in root.get("/api/groups").json()["data"]} >= {"research"}

        plain = ada.get("/api/groups")
        assert plain.status_code == 403 and "GET /api/me" in plain.json()["error"]["message"]
        assert ada.post("/api/groups", json={"name": "mine"}).status_code == 403
        assert root.post("/api/groups", json={"name": "research"}).status_code == 409
        assert root.post("/api/groups", json={"name": "  "}).status_code == 400
        assert root.put("/api/groups/research/members/nobody").status_code == 404
        assert root.put("/api/groups/absent/members/ada").status_code == 404

        assert root.delete("/api/groups/research/members/ada").json()["members"] == []
        assert root.delete("/api/groups/research").status_code == 200
        assert root.delete("/api/groups/research").status_code == 404
        assert ada.get("/api/me").json()["groups"] == []


def test_removing_a_user_takes_them_out_of_their_groups(accounts):
    with closing(login(accounts, "root")) as root:
        assert root.post("/api/users", json={"name": "tmp-user", "password": "tmp-password"}).status_code == 201
        root.post("/api/groups", json={"name": "short-lived"})
        assert root.put("/api/groups/short-lived/members/tmp-user").status_code == 200
        assert root.delete("/api/users/tmp-user").status_code == 200
        assert all("tmp-user" not in g["members"] for g in root.get("/api/groups").json()["data"])


def test_the_docs_commands_run_as_written(cli, tmp_path):
    doc = (Path(__file__).parent.parent / "docs" / "groups.md").read_text()
    block = re.search(r"```sh\n(serge groups add.*?)```", doc, re.S).group(1)
    data = {"data_dir": str(tmp_path)}
    assert serge(cli, data, "users", "add", "ada", "--password-stdin", stdin="ada-password\n").returncode == 0
    for line in block.strip().splitlines():
        ran = serge(cli, data, *shlex.split(line)[1:])
        assert ran.returncode == 0, (line, ran.stderr)
        if line.endswith("groups shares"):
            assert ran.stdout.split() == ["model", "smollm2-135m-instruct", "ml-team", "preset", "reviewer", "ml-team",
                                          "tool_server", "clock", "ml-team"]


def test_a_groups_caps_are_set_by_cli_api_and_page_and_each_member_sees_where_theirs_come_from(cli, accounts):
    assert serge(cli, accounts, "groups", "add", "capped-team").returncode == 0
    assert serge(cli, accounts, "groups", "join", "capped-team", "ada").returncode == 0
    said = serge(cli, accounts, "groups", "quota", "capped-team", "--tokens-per-day", "5000")
    assert said.returncode == 0 and said.stdout.startswith("Group capped-team: 5,000 tokens a day"), said.stderr
    with closing(login(accounts, "root")) as root, closing(login(accounts, "ada")) as ada:
        assert root.get("/api/groups/capped-team/quota").json()["own"]["tokens_per_day"] == 5000
        put = root.put("/api/groups/capped-team/quota", json={"tokens_per_day": 5000, "requests_per_minute": 30})
        assert put.status_code == 200 and put.json()["own"]["requests_per_minute"] == 30
        assert root.put("/api/groups/absent/quota", json={}).status_code == 404
        assert ada.put("/api/groups/capped-team/quota", json={"tokens_per_day": 10**9}).status_code == 403
        assert ada.get("/api/groups/capped-team/quota").status_code == 403
        assert root.put("/api/quotas/default", json={"tokens_per_month": 90000}).status_code == 200
        assert root.put("/api/users/ada/quota", json={"requests_per_minute": 3}).status_code == 200

        mine = ada.get("/api/usage/mine").json()
        assert (mine["today"]["cap"], mine["today"]["cap_from"]) == (5000, "group:capped-team")
        assert (mine["month"]["cap"], mine["month"]["cap_from"]) == (90000, "default")
        assert (mine["requests_per_minute"], mine["requests_per_minute_from"]) == (3, "own")  # hers wins
        assert ada.get("/api/quota").json()["sources"] == {"tokens_per_day": "group:capped-team",
                                                           "tokens_per_month": "default", "requests_per_minute": "own"}
        page = ada.get("/usage").text
        assert "the quota of your group capped-team" in page and "the default quota" in page

        # a second group with a larger day cap: the most generous applies; set on the Groups page
        assert root.post("/api/groups", json={"name": "generous-team"}).status_code == 201
        assert root.put("/api/groups/generous-team/members/ada").status_code == 200
        form = root.post("/admin/groups/generous-team/quota", data={"tokens_per_day": "8000"})
        assert form.status_code == 200 and "Set the caps of generous-team." in form.text
        assert 'value="8000"' in root.get("/admin/groups").text
        assert root.post("/admin/groups/generous-team/quota", data={"tokens_per_day": "lots"}).status_code == 400
        assert ada.get("/api/usage/mine").json()["today"] == {**mine["today"], "cap": 8000,
                                                             "cap_from": "group:generous-team", "left": 8000}

        audit = root.get("/api/audit").json()["data"]
        assert any(e["action"] == "quota.set" and e["target"].startswith("group generous-team:") and
                   e["actor"] == "root" for e in audit), audit
        assert any(e["action"] == "quota.set" and e["target"].startswith("group capped-team:") and
                   e["actor"].startswith("cli:") for e in audit), audit
        assert root.delete("/api/groups/generous-team").status_code == 200  # its caps go with it
        assert ada.get("/api/usage/mine").json()["today"]["cap"] == 5000
        root.put("/api/quotas/default", json={})
        root.put("/api/users/ada/quota", json={})
        root.delete("/api/groups/capped-team")
