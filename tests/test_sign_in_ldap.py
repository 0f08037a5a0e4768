"""Sign-in with a directory's password on a real server over the stand-in model, against Debian's slapd started by
the test with a small directory (ldap_server.py): people sign in on the login form, their groups come from the
directory, and a wrong password, an empty one or a name with filter characters signs nobody in and makes nothing.
"""

from __future__ import annotations

import re
import shlex
import time
from contextlib import ExitStack, closing, contextmanager
from pathlib import Path

import httpx
import pytest
from conftest import free_port, own_server
from ldap_server import SUFFIX, directory, entries, installed, remove
from standin import stand_in
from test_sign_in_proxy import first_account

from serge.settings import Settings
from serge.store import AccountStore, Database
from serge.store.people.audit import AuditStore

if not installed():
    pytest.skip("Debian's slapd and ldap-utils are not installed (apt-get install slapd ldap-utils; .ci/run does)",
                allow_module_level=True)

settings, engine = stand_in("settings", "engine")

PEOPLE = {"ada": {"password": "ada-directory-password", "mail": "ada@example.org"},
          "bo": {"password": "bo-directory-password", "mail": "bo@example.org"},
          "cy": {"password": "cy-directory-password", "mail": "cy@example.org"},
          "dee": {"password": "dee-directory-password", "mail": "dee@example.org"}}
GROUPS = {"ml-team": ["ada", "bo"], "serge-admins": ["ada"]}
DOC = Path(__file__).parent.parent / "docs" / "sign-in-ldap.md"


@pytest.fixture(scope="module")
def ldap_url(tmp_path_factory):
    with directory(tmp_path_factory.mktemp("slapd"), free_port(), entries(PEOPLE, GROUPS)) as url:
        yield url


def served(settings, engine, tmp_path_factory, name: str, url: str, **changes):
    """A server whose first account (an admin, with a password) was made with `serge users add`."""
    folder = tmp_path_factory.mktemp(name)
    first_account(folder)
    with own_server(settings, engine, folder, ldap_url=url, ldap_user_base=f"ou=people,{SUFFIX}",
                    ldap_group_base=f"ou=groups,{SUFFIX}", ldap_admin_group="serge-admins", **changes) as served_url:
        yield {"url": served_url, "data_dir": folder}


@pytest.fixture(scope="module")
def site(settings, engine, tmp_path_factory, ldap_url):
    yield from served(settings, engine, tmp_path_factory, "ldap", ldap_url)


@pytest.fixture(scope="module")
def syncing(settings, engine, tmp_path_factory, ldap_url):
    """A server that asks the directory about its accounts every second by itself."""
    yield from served(settings, engine, tmp_path_factory, "ldap-sync", ldap_url, sign_in_sync_s=1)


@pytest.fixture(scope="module")
def unreachable(settings, engine, tmp_path_factory):
    yield from served(settings, engine, tmp_path_factory, "ldap-down", f"ldap://127.0.0.1:{free_port()}")


def names(site) -> set[str]:
    db = Database(f"sqlite:///{site['data_dir'] / 'serge.db'}")
    try:
        return {u.name for u in AccountStore(db).users()}
    finally:
        db.close()


def cut_offs(site) -> list[str]:
    db = Database(f"sqlite:///{site['data_dir'] / 'serge.db'}")
    try:
        return [f"{e.actor} {e.target}" for e in AuditStore(db).entries() if e.action == "user.cut_off"]
    finally:
        db.close()


def works(site, client: httpx.Client, key: str) -> tuple[int, int]:
    """What the person's login and their API key are answered now."""
    return (client.get("/api/me").status_code,
            httpx.get(site["url"] + "/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code)


def log_in(site, name: str, password: str) -> tuple[httpx.Response, httpx.Client]:
    client = httpx.Client(base_url=site["url"], timeout=60)
    return client.post("/login", data={"name": name, "password": password, "next": "/c/x"}), client


def test_people_sign_in_with_their_directory_password_and_bring_their_groups(site):
    answer, client = log_in(site, "ada", PEOPLE["ada"]["password"])
    with closing(client):
        assert answer.status_code == 303 and answer.headers["location"] == "/c/x"
        me = client.get("/api/me").json()
    assert (me["name"], me["email"], me["signed_in_by"], me["admin"]) == ("ada", "ada@example.org", "ldap", True)
    assert me["groups"] == ["ml-team", "serge-admins"]
    answer, client = log_in(site, "bo", PEOPLE["bo"]["password"])
    with closing(client):
        me = client.get("/api/me").json()
    assert (me["name"], me["admin"], me["groups"]) == ("bo", False, ["ml-team"])
    again, client = log_in(site, "ada", PEOPLE["ada"]["password"])
    client.close()
    assert again.status_code == 303 and {"root", "ada", "bo"} <= names(site)


@pytest.mark.parametrize("name, password", [
    ("ada", "not-her-password"),
    ("ada", ""),  # a bind without a password would succeed as nobody
    ("nobody", "any-password"),
    ("*)(uid=*", "any-password"),
    ("*", PEOPLE["ada"]["password"]),
    ("ada)(|(uid=*", PEOPLE["ada"]["password"]),
])
def test_a_wrong_password_an_empty_one_or_filter_characters_sign_nobody_in(site, name, password):
    before = names(site)
    answer, client = log_in(site, name, password)
    with closing(client):
        assert answer.status_code == 401 and "Wrong name or password." in answer.text
        assert "serge_session" not in answer.cookies and client.get("/api/me").status_code == 401
    assert names(site) == before


def test_someone_removed_from_the_directory_loses_their_logins_and_keys_at_the_next_sync(site, ldap_url, cli,
                                                                                     monkeypatch):
    answer, cy = log_in(site, "cy", PEOPLE["cy"]["password"])
    _, ada = log_in(site, "ada", PEOPLE["ada"]["password"])
    with closing(cy), closing(ada):
        assert answer.status_code == 303
        key = cy.post("/api/keys", json={"name": "laptop"}).json()["key"]
        assert httpx.get(site["url"] + "/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
        remove(ldap_url, f"uid=cy,ou=people,{SUFFIX}")
        for name, value in {"SERGE_LDAP_URL": ldap_url, "SERGE_LDAP_USER_BASE": f"ou=people,{SUFFIX}"}.items():
            monkeypatch.setenv(name, value)
        synced = cli("users", "sync", "--data-dir", str(site["data_dir"]))
        assert synced.returncode == 0, synced.stderr
        assert f"cy: gone from the directory (uid=cy,ou=people,{SUFFIX}); their logins ended and 1 API key(s) " \
               "revoked." in synced.stdout
        assert "ada:" not in synced.stdout
        assert cy.get("/api/me").status_code == 401
        assert httpx.get(site["url"] + "/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 401
        assert ada.get("/api/me").status_code == 200
    answer, client = log_in(site, "cy", PEOPLE["cy"]["password"])
    client.close()
    assert answer.status_code == 401


def test_the_servers_own_sync_cuts_off_someone_removed_from_the_directory(syncing, ldap_url):
    answer, dee = log_in(syncing, "dee", PEOPLE["dee"]["password"])
    _, bo = log_in(syncing, "bo", PEOPLE["bo"]["password"])
    with closing(dee), closing(bo):
        assert answer.status_code == 303
        dee_key, bo_key = (c.post("/api/keys", json={"name": "laptop"}).json()["key"] for c in (dee, bo))
        time.sleep(1.5)  # a round or two while dee is in the directory: nothing changes
        assert works(syncing, dee, dee_key) == works(syncing, bo, bo_key) == (200, 200)
        remove(ldap_url, f"uid=dee,ou=people,{SUFFIX}")
        deadline = time.monotonic() + 20
        while works(syncing, dee, dee_key) != (401, 401) and time.monotonic() < deadline:
            time.sleep(0.5)  # two requests a poll: well under the requests-a-minute limit
        assert works(syncing, dee, dee_key) == (401, 401)
        assert works(syncing, bo, bo_key) == (200, 200)
        time.sleep(1.5)  # more rounds find dee gone again, with nothing left to end: noted once
    assert cut_offs(syncing) == [f"serge dee (gone from the directory (uid=dee,ou=people,{SUFFIX}); 1 login(s) "
                                 "ended, 1 API key(s) revoked)"]


def test_a_directory_that_goes_down_cuts_nobody_off(settings, engine, tmp_path_factory):
    slapd = ExitStack()
    url = slapd.enter_context(directory(tmp_path_factory.mktemp("slapd-down"), free_port(), entries(PEOPLE, GROUPS)))
    with slapd, contextmanager(served)(settings, engine, tmp_path_factory, "ldap-sync-down", url,
                                       sign_in_sync_s=1) as site:
        _, bo = log_in(site, "bo", PEOPLE["bo"]["password"])
        with closing(bo):
            key = bo.post("/api/keys", json={"name": "laptop"}).json()["key"]
            slapd.close()  # the directory stops
            time.sleep(3.5)  # three rounds without it
            assert works(site, bo, key) == (200, 200)
    assert cut_offs(site) == []


def test_a_directory_that_cannot_be_reached_is_a_clear_503(unreachable):
    answer, client = log_in(unreachable, "ada", "any-password")
    client.close()
    assert answer.status_code == 503 and "directory that checks passwords cannot be reached" in answer.text


def test_the_docs_settings_are_what_serge_reads(monkeypatch):
    block = re.search(r"```sh\n(SERGE_LDAP_URL=.*?)```", DOC.read_text(), re.S).group(1)
    for line in block.strip().splitlines():
        name, _, value = line.partition("=")
        monkeypatch.setenv(name, shlex.split(value)[0])
    read = Settings()
    assert read.ldap_url.startswith("ldaps://") and "{name}" in read.ldap_user_filter and read.ldap_group_base
    named = set(re.findall(r"SERGE_(LDAP_[A-Z_]+)", DOC.read_text()))
    assert named == {f.upper() for f in Settings.model_fields if f.startswith("ldap_")}
