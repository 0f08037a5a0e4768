"""The database connection: an SQLAlchemy engine and session factory built from one URL.

SQLite (the default, a file in the data dir) gets WAL and foreign keys, so a
reply being saved never blocks a reader and deleting a chat deletes its
messages. A write the database refuses for a reason outside Serge (another
program holding a lock past the busy timeout, a full disk) comes out as
`DatabaseUnavailable`, whose message says which, so callers can tell the user
instead of failing with an unknown error. Migrations are applied in code at start, from the Alembic scripts
packaged beside this file, so an installed Serge can upgrade its own database.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, ExceptionContext, make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS = Path(__file__).parent / "migrations"
_REASONS = {  # words in the driver's message -> what the user is told
    "locked": "the database is locked by another program",
    "full": "the disk holding the database is full",
    "no space left": "the disk holding the database is full",
    "disk i/o": "the disk holding the database failed to write",
    "readonly": "the database is read-only",
    "read-only": "the database is read-only",
}


class DatabaseUnavailable(RuntimeError):
    """The database refused a read or write for a reason outside Serge; nothing of that call was saved."""

    def __init__(self, reason: str, outcome: str = "nothing was saved; try again once that is fixed") -> None:
        super().__init__(f"{reason}; {outcome}")
        self.reason = reason


def _sqlite_pragmas(busy_timeout_s: float):
    def apply(dbapi_connection, _record) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        cursor.close()

    return apply


def _unavailable(context: ExceptionContext) -> None:
    """Turn a lock timeout or a full disk into `DatabaseUnavailable`; other errors pass unchanged."""
    error = context.sqlalchemy_exception
    if not isinstance(error, OperationalError):
        return
    text = str(context.original_exception).lower()
    reason = next((told for words, told in _REASONS.items() if words in text), None)
    if reason is not None:
        raise DatabaseUnavailable(f"{reason} ({context.original_exception})") from context.original_exception


class Database:
    def __init__(self, url: str, busy_timeout_s: float = 10.0) -> None:
        parsed = make_url(url)
        kwargs: dict = {"pool_pre_ping": True}
        if parsed.get_backend_name() == "sqlite":
            kwargs = {"connect_args": {"check_same_thread": False, "timeout": busy_timeout_s}}
            if parsed.database and parsed.database != ":memory:":
                Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        self.engine: Engine = create_engine(parsed, **kwargs)
        event.listen(self.engine, "handle_error", _unavailable)
        if parsed.get_backend_name() == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas(busy_timeout_s))
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
