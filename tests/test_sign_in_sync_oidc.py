"""Someone removed at the OpenID provider loses their Serge logins and API keys at the next sync, run by
`serge users sync` or by the server itself every SERGE_SIGN_IN_SYNC_S; a provider in trouble cuts nobody off.

The provider is npm's oidc-provider (oidc_provider.py), which gives Serge a refresh token for offline_access;
the sync redeems it, and the provider answers `invalid_grant` once the account is gone. People sign in on the
provider's own pages (over HTTP), on a real server over the stand-in model.
"""

from __future__ import annotations

import logging
import time
from contextlib import closing, contextmanager
from pathlib import Path

import httpx
import pytest
from conftest import free_port, held_port, own_server
from oidc_provider import CLIENT_ID, CLIENT_SECRET, installed, oidc_provider, sign_in_over_http
from standin import stand_in

from serge.store import Database
from serge.store.people.audit import AuditStore

if not installed():
    pytest.skip("the test OpenID provider is not installed: `npm ci --prefix tests/oidc` (make test does it)",
                allow_module_level=True)

settings, engine = stand_in("settings", "engine")

SCOPES = "openid profile email groups"
PEOPLE = {name: {"preferred_username": name, "email": f"{name}@example.org", "groups": ["staff"]}
          for name in ("ada", "bo", "cy")}


@contextmanager
def site_and_provider(settings, engine, folder: Path, sync_s: int):
    port = held_port()
    with oidc_provider(folder, free_port(), f"http://127.0.0.1:{port}", PEOPLE, refresh_tokens=True) as provider, \
            own_server(settings, engine, folder, port=port, oidc_issuer=provider.url, oidc_client_id=CLIENT_ID,
                       oidc_client_secret=CLIENT_SECRET, oidc_scopes=SCOPES, sign_in_sync_s=sync_s) as url:
        yield {"url": url, "data_dir": folder}, provider


def audit(site) -> list[str]:
    db = Database(f"sqlite:///{site['data_dir'] / 'serge.db'}")
    try:
        return [f"{e.actor} {e.action} {e.target}" for e in AuditStore(db).entries()]
    finally:
        db.close()


def key_of(client: httpx.Client) -> str:
    made = client.post("/api/keys", json={"name": "laptop"})
    assert made.status_code in (200, 201), made.text
    return made.json()["key"]


def works(site, client: httpx.Client, key: str) -> tuple[int, int]:
    """What the person's login and their API key are answered now."""
    return (client.get("/api/me").status_code,
            httpx.get(site["url"] + "/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code)


def until(check, seconds: float = 20):
    deadline = time.monotonic() + seconds
    while not check() and time.monotonic() < deadline:
        time.sleep(0.5)  # two requests a poll: well under the requests-a-minute limit
    return check()


def test_someone_removed_at_the_provider_loses_logins_and_keys_at_serge_users_sync_and_others_keep_theirs(
        settings, engine, tmp_path, cli, monkeypatch):
    with site_and_provider(settings, engine, tmp_path, sync_s=0) as (site, provider):
        ada, bo = sign_in_over_http(site["url"], "ada"), sign_in_over_http(site["url"], "bo")
        with closing(ada), closing(bo):
            ada_key, bo_key = key_of(ada), key_of(bo)
            assert works(site, ada, ada_key) == works(site, bo, bo_key) == (200, 200)
            provider.remove("ada")
            provider.change(accounts={"bo": PEOPLE["bo"] | {"groups": ["staff", "ml-team"]}})
            for name, value in {"SERGE_OIDC_ISSUER": provider.url, "SERGE_OIDC_CLIENT_ID": CLIENT_ID,
                                "SERGE_OIDC_CLIENT_SECRET": CLIENT_SECRET, "SERGE_OIDC_SCOPES": SCOPES}.items():
                monkeypatch.setenv(name, value)
            synced = cli("users", "sync", "--data-dir", str(site["data_dir"]))
            assert synced.returncode == 0, synced.stderr
            assert "ada: refused by the provider (invalid_grant" in synced.stdout
            assert "their logins ended and 1 API key(s) revoked." in synced.stdout and "bo:" not in synced.stdout
            assert works(site, ada, ada_key) == (401, 401)
            assert works(site, bo, bo_key) == (200, 200)
            assert bo.get("/api/me").json()["groups"] == ["ml-team", "staff"]  # from the renewed ID token
            assert any(e.startswith("cli:") and " user.cut_off ada (refused by the provider (invalid_grant" in e
                       for e in audit(site))
            again = cli("users", "sync", "--data-dir", str(site["data_dir"]))  # ada's grant was dropped
            assert again.returncode == 0 and "ada:" not in again.stdout and "Asked about 1 account(s)." in again.stdout


def test_the_servers_own_sync_cuts_off_someone_removed_at_the_provider(settings, engine, tmp_path):
    with site_and_provider(settings, engine, tmp_path, sync_s=1) as (site, provider):
        cy, bo = sign_in_over_http(site["url"], "cy"), sign_in_over_http(site["url"], "bo")
        with closing(cy), closing(bo):
            cy_key, bo_key = key_of(cy), key_of(bo)
            time.sleep(1.5)  # a round or two while the provider still knows cy: nothing changes
            assert works(site, cy, cy_key) == (200, 200)
            provider.remove("cy")
            assert until(lambda: works(site, cy, cy_key) == (401, 401)), works(site, cy, cy_key)
            assert works(site, bo, bo_key) == (200, 200)
        assert [e for e in audit(site) if "user.cut_off" in e] == [
            "serge user.cut_off cy (refused by the provider (invalid_grant (grant request is invalid)); 1 login(s) "
            "ended, 1 API key(s) revoked)"]


def test_a_provider_that_answers_5xx_or_is_down_cuts_nobody_off(settings, engine, tmp_path, cli, monkeypatch,
                                                                  caplog):
    caplog.set_level(logging.INFO, logger="serge.accounts.signin.sync")
    with site_and_provider(settings, engine, tmp_path, sync_s=1) as (site, provider):
        ada = sign_in_over_http(site["url"], "ada")
        with closing(ada):
            key = key_of(ada)
            provider.change(failing=True)  # its token endpoint answers 503
            provider.remove("ada")  # and would refuse her, could it answer
            time.sleep(3.5)  # three rounds
            assert works(site, ada, key) == (200, 200)
            for name, value in {"SERGE_OIDC_ISSUER": provider.url, "SERGE_OIDC_CLIENT_ID": CLIENT_ID,
                                "SERGE_OIDC_CLIENT_SECRET": CLIENT_SECRET}.items():
                monkeypatch.setenv(name, value)
            synced = cli("users", "sync", "--data-dir", str(site["data_dir"]))
            assert synced.returncode != 0 and "503" in synced.stderr and "nobody was cut off" in synced.stderr
            assert works(site, ada, key) == (200, 200)
        down = [r.getMessage() for r in caplog.records
                if r.threadName == "serge-sign-in-sync" and "could not ask oidc" in r.getMessage()]
        assert len(down) == 1, down  # the server's loop says it once, not at every round
    assert not [e for e in audit(site) if "user.cut_off" in e]


def test_a_provider_that_is_down_cuts_nobody_off(settings, engine, tmp_path):
    with site_and_provider(settings, engine, tmp_path, sync_s=1) as (site, provider):
        ada = sign_in_over_http(site["url"], "ada")
        with closing(ada):
            key = key_of(ada)
            provider.remove("ada")
            provider.stop()
            time.sleep(3.5)  # three rounds against a closed port
            assert works(site, ada, key) == (200, 200)
    assert not [e for e in audit(site) if "user.cut_off" in e]
