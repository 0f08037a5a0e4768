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
