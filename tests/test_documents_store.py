"""The documents store on SQLite (opened as Serge opens it, vectors scored by sqlite-vec; and through the standard
library's sqlite3 without it, vectors scored by Serge), and on PostgreSQL when SERGE_TEST_POSTGRES_URL names one (CI):
files kept once by their hash, owned by their account, gone with their chat; passages ranked by meaning and by words,
in the same order whoever scores the vectors."""

from __future__ import annotations

import logging
import sqlite3

import numpy as np
import pytest

from conftest import DATABASES, PGVECTOR, PGVECTOR_URL, POSTGRES_URL, fresh_database, migrate_to, own_server
from standin import stand_in
from serge.store import ChatStore, Database, DocumentNotFound, DocumentStore, FileStore, NewChunk
from serge.store.db import sqlite_driver

settings, engine = stand_in("settings", "engine")  # for the server's start; nothing here generates

def _serge_scores(url: str) -> Database:
    """The fallback where no driver can load sqlite-vec: the standard library's sqlite3, vectors scored by Serge."""
    return Database(url, sqlite_module=sqlite3, load_sqlite_vec=False)


@pytest.fixture(params=["sqlite-without-vec", *DATABASES, PGVECTOR])
def database(request, tmp_path):
    """The conftest's databases (SQLite as Serge opens it, with sqlite-vec), the SQLite one without it, and
    PostgreSQL with pgvector where one is named."""
    if request.param == "pgvector":
        db = fresh_database(PGVECTOR_URL)
        assert db.pgvector
    elif request.param != "sqlite-without-vec":
        db = fresh_database(f"sqlite:///{tmp_path / 'serge.db'}" if request.param == "sqlite" else POSTGRES_URL)
        assert bool(db.sqlite_vec) == (request.param == "sqlite") and db.pgvector is None
    else:
        db = _serge_scores(f"sqlite:///{tmp_path / 'serge.db'}")
        db.migrate()
        assert db.sqlite_vec is None
    yield db
    db.close()


def test_every_install_opens_sqlite_with_a_driver_that_loads_sqlite_vec(tmp_path):
    """The standard library's sqlite3 where it can load extensions, else sqlean.py (a runtime dependency), with WAL
    and the migrations (FTS5's tables among them) as on any other driver; the line serve logs at start says so."""
    can_load = hasattr(sqlite3.Connection, "enable_load_extension")
    assert sqlite_driver().__name__ == ("sqlite3" if can_load else "sqlean")
    db = Database(f"sqlite:///{tmp_path / 'serge.db'}")
    db.migrate()
    with db.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("SELECT count(*) FROM document_chunks_fts").scalar() == 0
    assert db.sqlite_vec and db.describe() == (
        f"SQLite {sqlite_driver().sqlite_version} through {sqlite_driver().__name__}, sqlite-vec {db.sqlite_vec} "
        "loaded: passages' vectors are scored in SQLite")
    db.close()


def test_the_server_says_once_at_start_which_driver_opened_the_database_and_who_scores_vectors(
        settings, engine, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="serge.web.app"), own_server(settings, engine, tmp_path / "data"):
        pass
    said = [r.getMessage() for r in caplog.records if "passages' vectors are scored" in r.getMessage()]
    assert len(said) == 1, said
    assert said[0].startswith(f"SQLite {sqlite_driver().sqlite_version} through {sqlite_driver().__name__}, "
                              "sqlite-vec v") and said[0].endswith(" loaded: passages' vectors are scored in SQLite")


@pytest.fixture
def stores(database, tmp_path):
    return ChatStore(database), DocumentStore(database, FileStore(tmp_path / "files"))


def _vector(*hot: int) -> np.ndarray:
    v = np.zeros(8, dtype=np.float32)
    v[list(hot)] = 1.0
    return v


def _add(docs: DocumentStore, owner: str, chat_id: str, data: bytes = b"bytes", name: str = "a.txt"):
    chunks = [NewChunk(1, "the ferry timetable for winter", _vector(0)),
              NewChunk(2, "the lighthouse keeper lives on the island", _vector(1)),
              NewChunk(3, "tide tables are printed each spring", _vector(2))]
    return docs.add(owner, chat_id, name=name, media_type="text/plain", data=data, pages=["p1", "p2", "p3"],
                    chunks=chunks)


def test_a_file_is_kept_once_by_its_hash_and_read_back(stores, tmp_path):
    chats, docs = stores
    chat = chats.create_chat("me", title="t")
    one, two = _add(docs, "me", chat.id), _add(docs, "me", chat.id)
    assert one.id != two.id and one.sha256 == two.sha256
    assert [p.name for p in (tmp_path / "files").rglob("*") if p.is_file()] == [one.sha256]
    assert docs.read("me", one.id) == b"bytes" and docs.get("me", one.id).pages == ("p1", "p2", "p3")
    assert oct(docs.files.path(one.sha256).stat().st_mode & 0o777) == "0o600"


def test_another_accounts_document_is_not_found(stores):
    chats, docs = stores
    chat = chats.create_chat("me", title="t")
    mine = _add(docs, "me", chat.id)
    with pytest.raises(DocumentNotFound):
        docs.get("you", mine.id)
    assert docs.list("you", chat.id) == []
    assert docs.by_words("you", [mine.id], ["lighthouse"], 5) == []
    assert docs.by_meaning("you", [mine.id], _vector(1), 5) == []


def test_a_chats_documents_go_with_it_and_shared_bytes_stay_while_used(stores, tmp_path):
    chats, docs = stores
    first, second = chats.create_chat("me", title="1"), chats.create_chat("me", title="2")
    a = _add(docs, "me", first.id)
    b = _add(docs, "me", second.id)
    only = _add(docs, "me", first.id, data=b"only in the first", name="only.txt")
    docs.delete_chat("me", first.id)
    chats.delete_chat("me", first.id)
    with pytest.raises(DocumentNotFound):
        docs.get("me", a.id)
    assert not docs.files.path(only.sha256).exists() and docs.read("me", b.id) == b"bytes"
    assert [h.document_id for h in docs.by_words("me", [a.id, b.id], ["lighthouse"], 5)] == [b.id]


def test_passages_are_ranked_by_meaning_and_by_words(stores):
    chats, docs = stores
    doc = _add(docs, "me", chats.create_chat("me", title="t").id)
    near = docs.by_meaning("me", [doc.id], _vector(1) + 0.1 * _vector(2), 3)
    assert [h.page for h in near] == [2, 3, 1] and near[0].score > near[1].score
    worded = docs.by_words("me", [doc.id], ["keeps", "lighthouse"], 3)
    assert worded[0].page == 2 and "lighthouse" in worded[0].text
    assert docs.by_words("me", [doc.id], ['"', "OR", "bm25(", "; DROP"], 3) == []  # no query syntax from the user


def _corpus(rng: np.random.Generator) -> list[list[NewChunk]]:
    """Three files of random 16-dimension passages, with exact ties, a zero vector and a passage of no vector."""
    files = [[NewChunk(1, f"passage {f}-{i}", rng.standard_normal(16).astype(np.float32)) for i in range(40)]
             for f in range(3)]
    files[0][5] = NewChunk(1, "a copy", files[1][7].vector)  # the same vector in two files: a tie
    files[2][0] = NewChunk(1, "nothing", np.zeros(16, dtype=np.float32))
    files[2][1] = NewChunk(1, "no vector", None)
    return files


def test_sqlite_vec_ranks_the_passages_as_serge_does_over_vectors_written_without_it(tmp_path):
    url, rng = f"sqlite:///{tmp_path / 'serge.db'}", np.random.default_rng(0)
    plain = _serge_scores(url)
    assert plain.describe().endswith("sqlite-vec not loaded (not asked to): passages' vectors are scored by Serge")
    plain.migrate()
    chat = ChatStore(plain).create_chat("me", title="t")
    served = DocumentStore(plain, FileStore(tmp_path / "files"))
    ids = [served.add("me", chat.id, name=f"{n}.txt", media_type="text/plain", data=b"%d" % n, pages=["p"],
                      chunks=chunks).id for n, chunks in enumerate(_corpus(rng))]
    queries = [rng.standard_normal(16).astype(np.float32) for _ in range(10)] + [
        np.zeros(16, dtype=np.float32), _corpus(np.random.default_rng(0))[1][7].vector]
    expected = [served.by_meaning("me", ids, q, 12) for q in queries]
    plain.close()  # a second SQLite library in this process would not see the first one's locks
    vec = Database(url)  # the same file, opened as Serge opens it: its vectors as they were
    assert vec.sqlite_vec
    scored = DocumentStore(vec, served.files)
    in_sqlite = [scored.by_meaning("me", ids, q, 12) for q in queries]  # nothing kept yet: sqlite-vec scores
    scored.vectors.settle()
    kept = [scored.by_meaning("me", ids, q, 12) for q in queries]  # read into memory meanwhile: numpy scores
    assert all(scored.vectors.kept(d, 0) is not None for d in ids)
    for want, *got in zip(expected, in_sqlite, kept):
        for hits in got:
            assert [h.chunk_id for h in hits] == [h.chunk_id for h in want]
            assert np.allclose([h.score for h in hits], [h.score for h in want], atol=1e-5)
    assert scored.by_meaning("me", ids, np.ones(8, dtype=np.float32), 5) == []  # another model's size: no match
    vec.close()


@pytest.mark.postgres
@pytest.mark.skipif(not PGVECTOR_URL, reason="SERGE_TEST_PGVECTOR_URL is not set (no PostgreSQL with pgvector here)")
def test_pgvector_ranks_the_passages_as_serge_does_over_vectors_kept_before_its_column(tmp_path):
    """Migration 0008 fills pgvector's column from the vectors already kept; a file added after writes both."""
    from sqlalchemy import text

    rng = np.random.default_rng(0)
    db = fresh_database(PGVECTOR_URL)
    with db.engine.begin() as connection:
        migrate_to(connection, "0007", down=True)
    db.close()
    db = Database(PGVECTOR_URL)
    assert db.pgvector is None  # before 0008: Serge scores
    chat = ChatStore(db).create_chat("me", title="t")
    served = DocumentStore(db, FileStore(tmp_path / "files"))
    corpus = _corpus(rng)
    ids = [served.add("me", chat.id, name=f"{n}.txt", media_type="text/plain", data=b"%d" % n, pages=["p"],
                      chunks=chunks).id for n, chunks in enumerate(corpus[:2])]
    db.migrate()
    assert db.pgvector and db.describe().endswith(f"pgvector {db.pgvector}: passages' vectors are scored in PostgreSQL")
    ids.append(served.add("me", chat.id, name="2.txt", media_type="text/plain", data=b"2", pages=["p"],
                          chunks=corpus[2]).id)
    with db.engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM document_chunks WHERE embedding IS NOT NULL AND "
                                       "embedding_vector IS NULL")).scalar() == 0
    queries = [rng.standard_normal(16).astype(np.float32) for _ in range(10)] + [
        np.zeros(16, dtype=np.float32), corpus[1][7].vector]
    scored = DocumentStore(db, served.files)
    in_postgres = [scored.by_meaning("me", ids, q, 12) for q in queries]  # nothing kept yet: pgvector scores
    scored.vectors.settle()
    kept = [scored.by_meaning("me", ids, q, 12) for q in queries]  # read into memory meanwhile: numpy scores
    assert all(scored.vectors.kept(d, 0) is not None for d in ids)
    for want, got in zip(kept, in_postgres):
        assert [h.chunk_id for h in got] == [h.chunk_id for h in want]
        assert np.allclose([h.score for h in got], [h.score for h in want], atol=1e-5)
    assert scored.by_meaning("me", ids, np.ones(8, dtype=np.float32), 5) == []  # another model's size: no match
    db.close()


def test_kept_and_unkept_documents_are_ranked_together(stores):
    chats, docs = stores
    chat = chats.create_chat("me", title="t")
    first, second = (_add(docs, "me", chat.id, data=b"%d" % n) for n in range(2))
    query = _vector(1) + 0.1 * _vector(2)
    whole = docs.by_meaning("me", [first.id, second.id], query, 6)
    docs.vectors.settle()
    docs.vectors = type(docs.vectors)()  # the first file kept in memory, the second not
    with docs.db.session() as session:
        docs.vectors.read(session, first.id, 0)
    mixed = docs.by_meaning("me", [first.id, second.id], query, 6)
    assert [(h.document_id, h.page) for h in mixed] == [(h.document_id, h.page) for h in whole] == [
        (d, page) for page in (2, 3, 1) for d in sorted([first.id, second.id])]
