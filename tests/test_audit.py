"""The audit log on a real server over the stand-in model: admin actions made through the API, the pages and the
`serge` command are recorded with who, what and when, read by admins on the page, as JSON and as CSV, and by
nobody else; a tool server's secret header never appears in it."""

from __future__ import annotations

import csv
import io
from contextlib import closing

import httpx
import pytest
from conftest import own_server
from standin import NAME, stand_in

settings, engine = stand_in("settings", "engine")

PASSWORDS = {"root": "root-password", "bo": "bo-password"}


def login(url: str, name: str) -> httpx.Client:
    client = httpx.Client(base_url=url, timeout=60)
    assert client.post("/login", data={"name": name, "password": PASSWORDS[name]}).status_code == 303
    return client


@pytest.fixture(scope="module")
def site(settings, engine, tmp_path_factory):
    folder = tmp_path_factory.mktemp("audit")
    with own_server(settings, engine, folder) as url:
        with httpx.Client(base_url=url) as local:
            assert local.post("/api/users", json={"name": "root", "password": PASSWORDS["root"]}).status_code == 201
        yield {"url": url, "data_dir": str(folder)}


def test_admin_actions_through_the_api_the_pages_and_the_cli_are_recorded_with_who_and_what(site, cli):
    with closing(login(site["url"], "root")) as root:
        assert root.post("/api/users", json={"name": "bo", "password": PASSWORDS["bo"]}).status_code == 201
        assert root.post("/api/groups", json={"name": "ml"}).status_code == 201
        assert root.put("/api/groups/ml/members/bo").status_code == 200
        assert root.put(f"/api/groups/ml/shares/model/{NAME}").status_code == 200
        assert root.put("/api/users/bo/quota", json={"tokens_per_day": 1000}).status_code == 200
        assert root.post("/api/mcp/servers", json={"name": "far", "url": "http://127.0.0.1:9/mcp", "check": False,
                                                   "headers": {"Authorization": "Bearer very-secret"}}
                         ).status_code == 201
        assert root.post("/admin/groups", data={"name": "from-the-page"}).status_code == 200
        assert cli("groups", "add", "from-the-cli", "--data-dir", site["data_dir"]).returncode == 0
        log = root.get("/api/audit").json()["data"]
    done = [(e["actor"], e["action"], e["target"]) for e in reversed(log)]
    assert done[0] == ("local", "user.add", "root (admin)")
    assert done[1:7] == [("root", "user.add", "bo"), ("root", "group.add", "ml"), ("root", "group.join", "bo in ml"),
                         ("root", "share", f"model {NAME} with ml"), done[5], ("root", "tool_server.add", "far")]
    assert done[5][:2] == ("root", "quota.set") and "tokens_per_day=1000" in done[5][2]
    assert done[7] == ("root", "group.add", "from-the-page")
    assert done[8][0].startswith("cli:") and done[8][1:] == ("group.add", "from-the-cli")
    assert all(e["at"] >= f["at"] for e, f in zip(log, log[1:])), "newest first"
    assert "very-secret" not in str(log)


def test_the_log_is_for_admins_on_the_page_as_json_and_as_csv(site):
    with closing(login(site["url"], "root")) as root:
        page = root.get("/admin/audit")
        assert page.status_code == 200 and "group.join" in page.text and "bo in ml" in page.text
        exported = root.get("/api/audit.csv")
        assert exported.headers["content-type"].startswith("text/csv")
        rows = list(csv.reader(io.StringIO(exported.text)))
        assert rows[0] == ["at", "actor", "action", "target"]
        assert ["root", "share", f"model {NAME} with ml"] in [r[1:] for r in rows[1:]]
    with closing(login(site["url"], "bo")) as bo:
        assert bo.get("/api/audit").status_code == 403
        assert bo.get("/api/audit.csv").status_code == 403
        assert bo.get("/admin/audit").status_code == 403
