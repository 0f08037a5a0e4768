"""Issue 18's promises that need no model: private files, keys that end with a password, and the guard.

The data dir Serge makes is 0700 and its SQLite files 0600 whatever the umask, and `serge serve`
warns once when others can read them; a new password revokes the user's API keys unless
--keep-keys; an Origin is the page's own only with the request's own scheme, a browser's
`Sec-Fetch-Site: cross-site` is believed over an Origin, and any forwarding header means relayed.
"""

from __future__ import annotations

import logging
import os
import stat

import pytest
from starlette.datastructures import Headers

from serge.cli.main import main, warn_if_exposed
from serge.settings import Settings
from serge.store import Database
from serge.web.http.auth import is_local
from serge.web.http.guard import HostPolicy


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def open_umask():
    saved = os.umask(0)
    yield
    os.umask(saved)


def test_the_data_dir_and_database_files_are_the_owners_alone_whatever_the_umask(tmp_path, open_umask):
    settings = Settings(data_dir=tmp_path / "fresh" / "serge")
    assert warn_if_exposed(settings) == []
    db = Database(settings.database)
    db.migrate()
    with db.engine.begin() as connection:  # a write: SQLite makes its -wal and -shm files
        connection.exec_driver_sql("CREATE TABLE probe (x)")
        connection.exec_driver_sql("INSERT INTO probe VALUES (1)")
        files = [settings.data_dir / name for name in ("serge.db", "serge.db-wal", "serge.db-shm")]
        assert all(f.exists() for f in files)
        assert mode(settings.data_dir) == 0o700
        assert {f.name: mode(f) for f in files} == {f.name: 0o600 for f in files}
    db.close()


def test_serve_warns_once_when_others_can_read_the_chats(tmp_path, open_umask, monkeypatch, caplog):
    data = tmp_path / "old"
    data.mkdir(mode=0o755)
    (data / "serge.db").touch(mode=0o644)  # as an older Serge left them
    (data / "serge.db-wal").touch(mode=0o644)

    class Stop(Exception):
        pass

    def no_engine(_settings):
        raise Stop

    monkeypatch.setattr("serge.engine.Engine", no_engine)
    with caplog.at_level(logging.WARNING), pytest.raises(Stop):
        main(["serve", "--data-dir", str(data), "--port", "1"])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(data) in warnings[0] and "chmod 700" in warnings[0], warnings
    assert mode(data / "serge.db") == 0o600 and mode(data / "serge.db-wal") == 0o600, "Serge's own files: tightened"
    data.chmod(0o700)
    assert warn_if_exposed(Settings(data_dir=data)) == []


def test_a_new_password_revokes_the_users_keys_unless_kept(tmp_path, cli):
    d = ("--data-dir", str(tmp_path))
    assert cli("users", "add", "bob", "--password-stdin", *d, stdin="battery staple\n").returncode == 0
    first = cli("keys", "create", "bob", *d).stdout.strip()
    changed = cli("users", "passwd", "bob", "--password-stdin", *d, stdin="a new password\n")
    assert changed.returncode == 0 and "1 API key(s) of theirs were revoked" in changed.stdout, changed.stdout
    listed = cli("keys", "list", "bob", *d).stdout
    assert first[:17] in listed and "revoked" in listed and "active" not in listed

    second = cli("keys", "create", "bob", *d).stdout.strip()
    kept = cli("users", "passwd", "bob", "--keep-keys", "--password-stdin", *d, stdin="another password\n")
    assert kept.returncode == 0 and "kept" in kept.stdout
    assert "active" in [line for line in cli("keys", "list", "bob", *d).stdout.splitlines()
                        if second[:17] in line][0]


def refusal(origin: str | None = None, scheme: str = "http", **headers) -> int | None:
    policy = HostPolicy.of(Settings())
    sent = {"host": "127.0.0.1:8008", **({"origin": origin} if origin else {}),
            **{k.replace("_", "-"): v for k, v in headers.items()}}
    found = policy.check("POST", "/api/chats", Headers(sent), scheme)
    return found.status if found else None


def test_an_origin_with_another_scheme_is_not_the_pages_own():
    assert refusal("http://127.0.0.1:8008") is None
    assert refusal("https://127.0.0.1:8008") == 403
    assert refusal("http://127.0.0.1:8008", "https") == 403  # and the other way round


def test_a_browser_saying_cross_site_is_believed_over_an_origin_that_looks_like_ours():
    assert refusal("http://127.0.0.1:8008", sec_fetch_site="cross-site") == 403
    assert refusal("http://127.0.0.1:8008", sec_fetch_site="same-site") == 403
    assert refusal("http://127.0.0.1:8008", sec_fetch_site="same-origin") is None
    cors = HostPolicy.of(Settings(cors_origins="https://app.example"))
    assert cors.check("POST", "/v1/chat/completions", Headers({"host": "127.0.0.1:8008", "origin": "https://app.example",
                                                               "sec-fetch-site": "cross-site"})) is None


@pytest.mark.parametrize("header", ["X-Forwarded-Port", "X-Client-IP", "X-Forwarded-For", "Forwarded", "X-Real-IP"])
def test_any_forwarding_header_means_the_request_was_relayed(header):
    scope = {"client": ("127.0.0.1", 5000), "headers": [(header.lower().encode(), b"203.0.113.9")]}
    assert not is_local(scope)
    assert is_local({"client": ("127.0.0.1", 5000), "headers": []})
