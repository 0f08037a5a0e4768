"""Sign-in by a trusted proxy's header, on real servers over the stand-in model, with real HTTP requests from
127.0.0.1: believed when 127.0.0.1 is the proxy's address the admin named, ignored when another is."""

from __future__ import annotations

import io
import re
import shlex
import sys
from contextlib import redirect_stdout
from pathlib import Path

import httpx
import pytest
from conftest import own_server
from pydantic import ValidationError
from standin import stand_in

from serge.cli.main import main as serge_main
from serge.settings import Settings
from serge.store import AccountStore, Database

settings, engine = stand_in("settings", "engine")

HEADER = "X-Forwarded-Email"
DOC = Path(__file__).parent.parent / "docs" / "sign-in-proxy.md"


def first_account(folder: Path) -> None:
    """`serge users add root`: accounts exist, so a request nobody vouches for is refused."""
    saved, sys.stdin = sys.stdin, io.StringIO("root-password\n")
    try:
        with redirect_stdout(io.StringIO()):
            serge_main(["users", "add", "root", "--password-stdin", "--data-dir", str(folder)])
    finally:
        sys.stdin = saved


def names(folder: Path) -> set[str]:
    db = Database(f"sqlite:///{folder / 'serge.db'}")
    try:
        return {u.name for u in AccountStore(db).users()}
    finally:
        db.close()


def proxied_server(settings, engine, tmp_path_factory, name: str, proxy: str):
    folder = tmp_path_factory.mktemp(name)
    first_account(folder)
    with own_server(settings, engine, folder, proxy_user_header=HEADER, proxy_user_from=proxy) as url:
        yield {"url": url, "data_dir": folder}


@pytest.fixture(scope="module")
def behind_this_proxy(settings, engine, tmp_path_factory):
    """The admin named 127.0.0.1, where these requests come from, as the proxy."""
    yield from proxied_server(settings, engine, tmp_path_factory, "proxy-believed", "127.0.0.1, 10.0.0.0/8")


@pytest.fixture(scope="module")
def behind_another_proxy(settings, engine, tmp_path_factory):
    """The admin named 192.0.2.10 as the proxy: requests from 127.0.0.1 are not the proxy's."""
    yield from proxied_server(settings, engine, tmp_path_factory, "proxy-other", "192.0.2.10")


def test_the_proxys_header_signs_the_person_in_and_makes_their_account_once(behind_this_proxy):
    url = behind_this_proxy["url"]
    me = httpx.get(url + "/api/me", headers={HEADER: "ada@example.org"})
    assert me.status_code == 200, me.text
    assert (me.json()["name"], me.json()["email"], me.json()["signed_in_by"]) == ("ada", "ada@example.org", "proxy")
    again = httpx.get(url + "/api/me", headers={HEADER: "Ada@Example.org"}).json()
    assert again["id"] == me.json()["id"]
    assert httpx.get(url + "/v1/models", headers={HEADER: "ada@example.org"}).status_code == 200
    page = httpx.get(url + "/", headers={HEADER: "ada@example.org", "Accept": "text/html"})
    assert page.status_code == 200 and "Signed in as <strong>ada</strong>" in page.text
    assert sorted(names(behind_this_proxy["data_dir"])) == ["ada", "root"]


def test_a_key_made_through_the_proxy_works_without_it(behind_this_proxy):
    url = behind_this_proxy["url"]
    made = httpx.post(url + "/api/keys", json={"name": "script"}, headers={HEADER: "bo@example.org"})
    assert made.status_code == 201, made.text
    me = httpx.get(url + "/api/me", headers={"Authorization": f"Bearer {made.json()['key']}"}).json()
    assert (me["name"], me["by_api_key"]) == ("bo", True)


def test_the_proxys_header_from_another_address_is_ignored(behind_another_proxy):
    url = behind_another_proxy["url"]
    me = httpx.get(url + "/api/me", headers={HEADER: "ada@example.org"})
    assert me.status_code == 401 and "log in first" in me.json()["error"]["message"]
    page = httpx.get(url + "/", headers={HEADER: "ada@example.org", "Accept": "text/html"})
    assert page.status_code == 303 and page.headers["location"].startswith("/login")
    assert names(behind_another_proxy["data_dir"]) == {"root"}


def test_a_proxy_named_root_never_becomes_the_local_account_root(behind_this_proxy):
    me = httpx.get(behind_this_proxy["url"] + "/api/me", headers={HEADER: "root"}).json()
    assert me["name"].startswith("root-") and me["admin"] is False and me["signed_in_by"] == "proxy"


@pytest.mark.parametrize("value", ["", "x" * 400])
def test_a_header_that_names_nobody_is_a_clear_400(behind_this_proxy, value):
    answer = httpx.get(behind_this_proxy["url"] + "/api/me", headers={HEADER: value})
    assert answer.status_code == 400 and "names nobody Serge can use" in answer.json()["error"]["message"]


@pytest.mark.parametrize("changes, says", [
    ({"proxy_user_header": HEADER}, "SERGE_PROXY_USER_FROM is not"),
    ({"proxy_user_header": HEADER, "proxy_user_from": "*"}, "may not be"),
    ({"proxy_user_header": HEADER, "proxy_user_from": "proxy.example"}, "not an address or network"),
    ({"proxy_user_header": "X Bad: header", "proxy_user_from": "127.0.0.1"}, "proxy_user_header"),
])
def test_settings_that_would_believe_anyone_are_refused_at_start(changes, says):
    with pytest.raises(ValidationError, match=says):
        Settings(**changes)


def test_the_docs_settings_are_what_serge_reads(monkeypatch):
    for block in re.findall(r"```sh\n(SERGE_PROXY_USER_HEADER=.*?)```", DOC.read_text(), re.S):
        for line in block.strip().splitlines():
            name, _, value = line.partition("=")
            monkeypatch.setenv(name, shlex.split(value)[0])
        read = Settings()
        assert read.proxy_user_header in ("X-Forwarded-Email", "Remote-User") and read.proxy_user_from
