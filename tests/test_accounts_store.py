"""Accounts below the web: the migrated schema, upgrading a database from before accounts, the
secret file and the per-user limiter. No model, no server: these run in a second.
"""

from __future__ import annotations

import stat
from datetime import timedelta

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text

from serge.accounts import Accounts, LoginSessions, load_secret
from serge.store import LOCAL_OWNER, AccountStore, ChatStore, Database
from serge.store.tables import FULL_TEXT_COLUMN, FULL_TEXT_INDEX, FULL_TEXT_TABLE, Base
from serge.web.http.limits.user_limits import UserLimits

from conftest import DATABASES, POSTGRES_URL, migrate_to



@pytest.fixture(params=DATABASES)
def empty_db(request, tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'serge.db'}" if request.param == "sqlite" else POSTGRES_URL)
    with db.engine.begin() as conn:
        Base.metadata.drop_all(conn)
        conn.execute(text("DROP TABLE IF EXISTS alembic_version"))
    yield db
    db.close()


def _upgrade(db: Database, revision: str) -> None:
    with db.engine.begin() as connection:
        migrate_to(connection, revision)


def test_the_migrated_schema_matches_the_tables(empty_db):
    empty_db.migrate()
    with empty_db.engine.connect() as conn:
        unmapped = {"include_name": lambda name, kind, _: not (kind == "table" and name.startswith(FULL_TEXT_TABLE)
                                                               or name in (FULL_TEXT_COLUMN, FULL_TEXT_INDEX))}
        differences = compare_metadata(MigrationContext.configure(conn, opts=unmapped), Base.metadata)
    assert differences == [], "the migrations and serge/store/tables.py disagree; add a migration"


def test_a_database_from_before_accounts_upgrades_and_its_chats_go_to_the_first_account(empty_db):
    _upgrade(empty_db, "0001")
    with empty_db.engine.begin() as connection:  # a chat as 0001's table holds it (today's ORM has more columns)
        connection.execute(text("INSERT INTO chats (id, owner, title, settings, created_at, updated_at) "
                                "VALUES ('c0ffee', :owner, 'made before accounts', '{}', :at, :at)"),
                           {"owner": LOCAL_OWNER, "at": "2026-01-01 00:00:00.000000"})
    empty_db.migrate()
    chats = ChatStore(empty_db)
    accounts = Accounts(AccountStore(empty_db))
    assert not accounts.has_users()
    first = accounts.add_user("ada", "correct horse", admin=False)
    second = accounts.add_user("bo", "battery staple")
    assert first.admin and not second.admin, "the first account is an admin whatever it asked for"
    assert [c.id for c in chats.list_chats(first.id)] == ["c0ffee"]
    assert chats.list_chats(LOCAL_OWNER) == [] and chats.list_chats(second.id) == []


def test_a_session_signed_with_another_secret_is_refused(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'serge.db'}")
    db.migrate()
    store = AccountStore(db)
    user = Accounts(store).add_user("ada", "correct horse")
    ours = LoginSessions(store, load_secret(tmp_path / "a"), lifetime=timedelta(days=1))
    theirs = LoginSessions(store, load_secret(tmp_path / "b"), lifetime=ours.lifetime)
    cookie = ours.start(user)
    assert ours.user(cookie) == user
    assert theirs.user(cookie) is None
    token, _, _ = cookie.rpartition(".")
    assert ours.user(token + ".forged") is None and ours.user(token) is None
    ours.end(cookie)
    assert ours.user(cookie) is None, "a session that ended stays ended"
    db.close()


def test_the_secret_is_made_once_readable_by_its_owner_only(tmp_path):
    first = load_secret(tmp_path)
    path = tmp_path / "secret.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_secret(tmp_path) == first, "a restart keeps the secret (and everyone's logins)"
    assert len(first) >= 32 and load_secret(tmp_path / "elsewhere") != first
    path.chmod(0o644)
    load_secret(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.write_text("short\n")
    with pytest.raises(ValueError, match="no usable secret"):
        load_secret(tmp_path)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_request_budget_refills_at_its_rate_and_names_the_wait():
    clock = Clock()
    limits = UserLimits(max_streams=2, per_minute=6, clock=clock)
    assert [limits.take("ada") for _ in range(6)] == [0] * 6, "a minute's worth may come at once"
    assert limits.take("ada") == 10, "6 a minute: the next one in 10 s"
    assert limits.take("bo") == 0, "one user's budget is not another's"
    clock.now += 9
    assert limits.take("ada") == 1
    clock.now += 1
    assert limits.take("ada") == 0


def test_replies_at_once_are_counted_per_user_and_freed():
    limits = UserLimits(max_streams=2, per_minute=60)
    assert limits.open_stream("ada") and limits.open_stream("ada")
    assert not limits.open_stream("ada")
    assert limits.open_stream("bo")
    limits.close_stream("ada")
    assert limits.open_stream("ada")
