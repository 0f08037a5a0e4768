"""The database connection: an SQLAlchemy engine and session factory built from one URL.

SQLite (the default, a file in the data dir) gets WAL and foreign keys, so a
reply being saved never blocks a reader and deleting a chat deletes its
messages. A write the database refuses for a reason outside Serge (another
program holding a lock past the busy timeout, a full disk) comes out as
`DatabaseUnavailable`, whose message says which, so callers can tell the user
instead of failing with an unknown error. Migrations are applied in code at start, from the Alembic scripts
packaged beside this file, so an installed Serge can upgrade its own database.

The chats and password hashes are the owner's alone: a data dir Serge makes is 0700,
and the SQLite file is made 0600 before SQLite opens it (its -wal and -shm files take
the database's mode), whatever the umask; one left more open by an older Serge is
tightened when opened. `exposed()` says what others on the machine can still read.

SQLite is opened through the standard library's sqlite3 where it can load extensions, else through
sqlean.py (`sqlite_driver`: the same DB-API over its own SQLite, FTS5 and WAL included, built with
loadable extensions; many Pythons' sqlite3 are built without them), so every install loads the
sqlite-vec extension into its connections (`Database.sqlite_vec` names the version, None where it
could not) and the documents store scores passages' vectors inside SQLite. One driver per process:
two SQLite libraries in one process do not see each other's locks.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path
from types import ModuleType

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine, ExceptionContext, make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from serge.store.notices import Notices

try:
    import sqlite_vec
except ImportError:  # the chat database works without it: vectors are then scored by Serge
    sqlite_vec = None
try:
    import sqlean
except ImportError:  # not installed where its wheels do not reach (Windows, whose sqlite3 loads extensions)
    sqlean = None

MIGRATIONS = Path(__file__).parent / "migrations"
_REASONS = {  # words in the driver's message -> what the user is told
    "locked": "the database is locked by another program",
    "full": "the disk holding the database is full",
    "no space left": "the disk holding the database is full",
    "disk i/o": "the disk holding the database failed to write",
    "readonly": "the database is read-only",
    "read-only": "the database is read-only",
}


PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
SQLITE_FILES = ("", "-wal", "-shm", "-journal")  # the database and the files SQLite keeps beside it


def private_dir(path: Path) -> None:
    """Make `path` (and missing parents) as a directory only its owner can enter; an existing one is left."""
    if not path.exists():
        path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)  # the mode is masked by the umask: never wider


def sqlite_path(url: str) -> Path | None:
    """The database file of a SQLite URL; None for another database or an in-memory one."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database)


def _private_sqlite(path: Path) -> None:
    private_dir(path.parent)
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, PRIVATE_FILE))  # before SQLite makes it with 0644
    for suffix in SQLITE_FILES:
        side = path.with_name(path.name + suffix)
        try:
            if side.exists() and side.stat().st_mode & 0o077:
                side.chmod(PRIVATE_FILE)
        except PermissionError:  # not ours: exposed() reports it
            pass


def exposed(data_dir: Path, url: str) -> list[Path]:
    """The data dir and SQLite files that other users of this machine may read or enter."""
    found = []
    paths = [data_dir]
    if (db := sqlite_path(url)) is not None:
        paths += [db.parent] if db.parent != data_dir else []
        paths += [db.with_name(db.name + suffix) for suffix in SQLITE_FILES]
    for path in paths:
        try:
            mode = path.stat().st_mode
        except OSError:
            continue
        if stat.S_IMODE(mode) & 0o077:
            found.append(path)
    return found


class DatabaseUnavailable(RuntimeError):
    """The database refused a read or write for a reason outside Serge; nothing of that call was saved."""

    def __init__(self, reason: str, outcome: str = "nothing was saved; try again once that is fixed") -> None:
        super().__init__(f"{reason}; {outcome}")
        self.reason = reason


def sqlite_driver() -> ModuleType:
    """The DB-API driver a SQLite database is opened with: the standard library's where its connections can load
    extensions, else sqlean.py's (where it is installed), else the standard library's without sqlite-vec."""
    if hasattr(sqlite3.Connection, "enable_load_extension") or sqlean is None:
        return sqlite3
    return sqlean


def _load_sqlite_vec(dbapi_connection) -> tuple[str | None, str]:
    """(sqlite-vec's version once loaded into this connection, or None; why it did not load)."""
    if sqlite_vec is None:
        return None, "the sqlite-vec package is not installed"
    if not hasattr(dbapi_connection, "enable_load_extension"):
        return None, f"{type(dbapi_connection).__module__} was built without loadable extensions"
    try:
        dbapi_connection.enable_load_extension(True)
        sqlite_vec.load(dbapi_connection)
    except Exception as exc:  # the driver's own error type: sqlite3's, sqlean's
        return None, str(exc)
    finally:
        dbapi_connection.enable_load_extension(False)  # no SQL may load a library after this
    return dbapi_connection.execute("SELECT vec_version()").fetchone()[0], ""


def _sqlite_pragmas(busy_timeout_s: float, loaded: dict, load_sqlite_vec: bool):
    def apply(dbapi_connection, _record) -> None:
        version, why = _load_sqlite_vec(dbapi_connection) if load_sqlite_vec else (None, "not asked to")
        loaded.update(version=version, why=why)
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
    def __init__(self, url: str, busy_timeout_s: float = 10.0, sqlite_module: ModuleType | None = None,
                 load_sqlite_vec: bool = True) -> None:
        """`sqlite_module`: the DB-API driver of a SQLite URL over `sqlite_driver()`'s choice (the benchmark's
        comparison); `load_sqlite_vec=False` keeps the scoring in Serge."""
        parsed = make_url(url)
        kwargs: dict = {"pool_pre_ping": True}
        sqlite = parsed.get_backend_name() == "sqlite"
        if sqlite:
            kwargs = {"connect_args": {"check_same_thread": False, "timeout": busy_timeout_s},
                      "module": sqlite_module or sqlite_driver()}
            if (path := sqlite_path(url)) is not None:
                _private_sqlite(path)
        self.engine: Engine = create_engine(parsed, **kwargs)
        event.listen(self.engine, "handle_error", _unavailable)
        self._loaded: dict = {}  # sqlite-vec's version in this database's connections, once one is made
        if sqlite:
            event.listen(self.engine, "connect", _sqlite_pragmas(busy_timeout_s, self._loaded, load_sqlite_vec))
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        self.notices = Notices(self.engine)  # a Stop's or an Allow's news, to every process at once

    @property
    def sqlite_vec(self) -> str | None:
        """The version of sqlite-vec this SQLite database's connections loaded; None where they could not."""
        if self.engine.dialect.name != "sqlite":
            return None
        if "version" not in self._loaded:
            self.engine.connect().close()
        return self._loaded["version"]

    @property
    def pgvector(self) -> str | None:
        """The version of pgvector whose column (migration 0008) this PostgreSQL database keeps passages'
        vectors in; None elsewhere. Read once: only a migration changes it."""
        if self.engine.dialect.name != "postgresql":
            return None
        if "pgvector" not in self._loaded:
            with self.engine.connect() as connection:
                self._loaded["pgvector"] = connection.execute(text(
                    "SELECT e.extversion FROM pg_extension e WHERE e.extname = 'vector' AND EXISTS ("
                    "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema() "
                    "AND table_name = 'document_chunks' AND column_name = 'embedding_vector')")).scalar()
        return self._loaded["pgvector"]

    def describe(self) -> str:
        """The line serve's start logs: the driver, and whether sqlite-vec scores passages' vectors (the CLI's
        other commands, a refused serve among them, say nothing of it)."""
        dbapi = self.engine.dialect.dbapi
        if self.engine.dialect.name != "sqlite":
            opened = f"{self.engine.dialect.name} through {dbapi.__name__}"
            if self.pgvector:
                return f"{opened}, pgvector {self.pgvector}: passages' vectors are scored in PostgreSQL"
            return f"{opened}: passages' vectors are scored by Serge"
        opened = f"SQLite {dbapi.sqlite_version} through {dbapi.__name__}"
        if self.sqlite_vec:
            return f"{opened}, sqlite-vec {self.sqlite_vec} loaded: passages' vectors are scored in SQLite"
        return f"{opened}, sqlite-vec not loaded ({self._loaded['why']}): passages' vectors are scored by Serge"

    def session(self) -> Session:
        return self.sessions()

    def migrate(self) -> None:
        """Bring the schema up to the newest migration (a no-op when it already is)."""
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        with self.engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
        self._loaded.pop("pgvector", None)  # read again: 0008 may have made the column

    def close(self) -> None:
        self.notices.close()
        self.engine.dispose()
