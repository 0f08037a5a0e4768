"""The database connection: an SQLAlchemy engine and session factory built from one URL.

SQLite (the default, a file in the data dir) gets WAL and foreign keys, so a
reply being saved never blocks a reader and deleting a chat deletes its
messages. Migrations are applied in code at start, from the Alembic scripts
packaged beside this file, so an installed Serge can upgrade its own database.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS = Path(__file__).parent / "migrations"


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.close()


class Database:
    def __init__(self, url: str) -> None:
        parsed = make_url(url)
        kwargs: dict = {"pool_pre_ping": True}
        if parsed.get_backend_name() == "sqlite":
            kwargs = {"connect_args": {"check_same_thread": False, "timeout": 10}}
            if parsed.database and parsed.database != ":memory:":
                Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        self.engine: Engine = create_engine(parsed, **kwargs)
        if parsed.get_backend_name() == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)

    def session(self) -> Session:
        return self.sessions()

    def migrate(self) -> None:
        """Bring the schema up to the newest migration (a no-op when it already is)."""
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        with self.engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, "head")

    def close(self) -> None:
        self.engine.dispose()
