"""Indexing in the background, below the web, on SQLite (and PostgreSQL where CI names one): progress while a file
is embedded, cancel, a restart that resumes after the last saved batch and loses nothing, and owner scoping in the
collections store. The embedder is a stand-in that can be held mid-file, so every step is seen, never timed."""

from __future__ import annotations

import threading

import pytest
import torch
from sqlalchemy import select, text

from conftest import migrate_to
from test_accounts_store import _upgrade
from test_chat_documents import HashEmbedder
from test_chats_api import wait_for

from serge.chats import Indexer, Knowledge
from serge.chats.documents import EMBED_BATCH, ChatDocuments
from serge.documents import passages
from serge.store import CollectionNotFound, CollectionStore, Database, DocumentNotFound, DocumentStore, FileStore
from serge.store.tables import DocumentChunk

WORDS = "harbour ferry tide lighthouse keeper island spring winter timetable authority boat".split()
# more than two batches of passages (about 600 new characters each)
BIG = "\n\n".join(f"Paragraph {i}: " + " ".join(WORDS[(i + j) % len(WORDS)] for j in range(90))
                  for i in range(EMBED_BATCH * 3 // 2)).encode()


class HeldEmbedder:
    """Embeds like `HashEmbedder`, counts what it embedded, and from call `hold_at` on waits to be let go."""

    def __init__(self, hold_at: int | None = None) -> None:
        self.calls, self.texts, self.hold_at = 0, 0, hold_at
        self.roll = 0  # another embedding model: the same texts, other vectors
        self.reached, self.go = threading.Event(), threading.Event()

    def embed(self, model, texts):
        self.calls += 1
        if self.hold_at is not None and self.calls >= self.hold_at:
            self.reached.set()
            self.go.wait(30)
        self.texts += len(texts)
        found = HashEmbedder().embed(texts)
        return type(found)(torch.roll(found.vectors, self.roll, dims=1), found.prompt_tokens, found.model)


class Embedding:
    """The one door of the engine the documents use."""

    def __init__(self, embedder) -> None:
        self.embedder = embedder

    def embed(self, model, texts):
        return self.embedder.embed(model, texts)


def service(db: Database, files: FileStore, embedder) -> tuple[Knowledge, Indexer]:
    store = DocumentStore(db, files)
    indexer = Indexer(CollectionStore(store), ChatDocuments(store, Embedding(embedder))).start()
    return Knowledge(indexer.store, indexer), indexer


@pytest.fixture
def files(tmp_path):
    return FileStore(tmp_path / "files")


def total_passages() -> int:
    return len(passages((BIG.decode(),)))


def test_progress_shows_files_and_passages_while_a_file_is_embedded(database, files):
    held = HeldEmbedder(hold_at=2)
    knowledge, indexer = service(database, files, held)
    try:
        box = knowledge.create("me", "box")
        first = knowledge.upload("me", box.id, "big.txt", BIG)
        knowledge.upload("me", box.id, "small.md", b"a small note on tides")
        assert held.reached.wait(30)
        [big, small] = knowledge.files("me", box.id)
        assert (big.document.state, big.passages, big.document.chunks_total) == ("indexing", EMBED_BATCH,
                                                                                total_passages())
        assert (small.document.state, small.passages) == ("queued", 0)
        now = knowledge.get("me", box.id)
        assert (now.files, now.files_indexed, now.files_waiting, now.passages) == (2, 0, 2, EMBED_BATCH)
        held.go.set()
        done = wait_for(lambda: (c := knowledge.get("me", box.id)).files_waiting == 0 and c, what="indexing")
        assert (done.files_indexed, done.passages) == (2, total_passages() + 1)
        assert knowledge.files("me", box.id)[0].document.id == first.id
    finally:
        held.go.set()
        indexer.close()


def test_cancel_stops_indexing_and_keeps_what_was_saved(database, files):
    held = HeldEmbedder(hold_at=2)
    knowledge, indexer = service(database, files, held)
    try:
        box = knowledge.create("me", "box")
        knowledge.upload("me", box.id, "big.txt", BIG)
        knowledge.upload("me", box.id, "later.md", b"never indexed")
        assert held.reached.wait(30)
        assert knowledge.cancel("me", box.id) == 2
        held.go.set()  # the batch embedded meanwhile is refused by the store
        indexer.close()  # joins the thread: it has done what it would do
        [big, later] = knowledge.files("me", box.id)
        assert (big.document.state, big.passages) == ("cancelled", EMBED_BATCH)
        assert (later.document.state, later.passages) == ("cancelled", 0)
        assert knowledge.get("me", box.id).files_waiting == 0
        in_box, _ = knowledge.searchable("me", [box.id])
        assert list(in_box) == [big.document.id]  # its saved passages are still searched
    finally:
        held.go.set()
        indexer.close()


def test_a_restart_mid_file_resumes_after_the_last_saved_batch(tmp_path, files):
    url = f"sqlite:///{tmp_path / 'serge.db'}"
    db = Database(url)
    db.migrate()
    held = HeldEmbedder(hold_at=2)
    knowledge, indexer = service(db, files, held)
    box = knowledge.create("me", "box")
    done_before = knowledge.upload("me", box.id, "done.md", b"finished before the stop")
    big = knowledge.upload("me", box.id, "big.txt", BIG)
    assert held.reached.wait(30)  # done.md indexed, big.txt's first batch saved, the second being embedded
    closing = threading.Thread(target=indexer.close)
    closing.start()
    held.go.set()
    closing.join(30)
    assert not indexer._thread.is_alive()
    saved = {f.document.name: (f.document.state, f.passages) for f in knowledge.files("me", box.id)}
    assert saved["done.md"] == ("indexed", 1) and saved["big.txt"][0] == "indexing"
    kept = saved["big.txt"][1]
    assert 0 < kept < total_passages()
    db.close()

    # a new process: the same database file, a fresh service
    db = Database(url)
    db.migrate()
    again = HeldEmbedder()
    knowledge, indexer = service(db, files, again)
    try:
        wait_for(lambda: knowledge.get("me", box.id).files_waiting == 0, what="the resumed file")
        progress = {f.document.name: (f.document.state, f.passages) for f in knowledge.files("me", box.id)}
        assert progress == {"done.md": ("indexed", 1), "big.txt": ("indexed", total_passages())}
        assert again.texts == total_passages() - kept  # only the rest was embedded
        store = indexer.store.documents
        assert store.chunk_count("me", [big.id]) == total_passages()
        with db.session() as session:
            seqs = sorted(session.scalars(select(DocumentChunk.seq).where(DocumentChunk.document_id == big.id)))
        assert seqs == list(range(total_passages()))  # no passage twice, none missing
        assert store.get("me", done_before.id).state == "indexed"
    finally:
        indexer.close()
        db.close()


def test_another_owners_collection_is_not_found_in_the_store(database, files):
    knowledge, indexer = service(database, files, HeldEmbedder())
    try:
        mine = knowledge.create("me", "mine")
        doc = knowledge.upload("me", mine.id, "a.md", b"the third stone")
        for attempt in (lambda: knowledge.get("you", mine.id), lambda: knowledge.files("you", mine.id),
                        lambda: knowledge.rename("you", mine.id, "x"), lambda: knowledge.delete("you", mine.id),
                        lambda: knowledge.reindex("you", mine.id), lambda: knowledge.cancel("you", mine.id),
                        lambda: knowledge.upload("you", mine.id, "b.md", b"b"),
                        lambda: knowledge.resolve("you", ["mine"], "knowledge"),
                        lambda: knowledge.resolve("you", [mine.id], "knowledge")):
            with pytest.raises(CollectionNotFound):
                attempt()
        with pytest.raises((CollectionNotFound, DocumentNotFound)):
            knowledge.delete_file("you", mine.id, doc.id)
        assert knowledge.list("you") == [] and knowledge.searchable("you", [mine.id]) == ({}, {})
        knowledge.create("you", "mine")  # names are per account
        assert knowledge.resolve("me", ["mine"], "knowledge") == [mine.id]
    finally:
        indexer.close()


def test_vectors_of_a_changed_file_are_read_again(database, files):
    """The in-memory matrix is keyed by the file's revision: a re-index writes new vectors, searches see them."""
    embedder = HeldEmbedder()
    knowledge, indexer = service(database, files, embedder)
    try:
        box = knowledge.create("me", "box")
        doc = knowledge.upload("me", box.id, "a.md", b"the lighthouse keeper")
        wait_for(lambda: knowledge.get("me", box.id).files_waiting == 0, what="indexing")
        store = indexer.store.documents
        query = HashEmbedder().embed(["lighthouse"]).vectors[0].numpy()
        assert store.by_meaning("me", [doc.id], query, 5)[0].score > 0.5
        embedder.roll = 1
        knowledge.reindex("me", box.id)
        wait_for(lambda: knowledge.get("me", box.id).files_waiting == 0, what="re-indexing")
        assert store.by_meaning("me", [doc.id], query, 5)[0].score < 0.5  # the new vectors, not the kept ones
        knowledge.delete_file("me", box.id, doc.id)
        other = knowledge.upload("me", box.id, "b.md", b"the ferry timetable")
        wait_for(lambda: knowledge.get("me", box.id).files_waiting == 0, what="indexing")
        assert [h.text for h in store.by_meaning("me", [doc.id, other.id], query, 5)] == ["the ferry timetable"]
    finally:
        indexer.close()


def test_a_chats_passages_survive_the_upgrade_to_collections(tmp_path, files):
    """0007 copies `documents` on SQLite (to let chat_id be null); the passages and their word index must stay."""
    db = Database(f"sqlite:///{tmp_path / 'old.db'}")
    _upgrade(db, "0006")
    with db.engine.begin() as conn:
        conn.execute(text("INSERT INTO chats (id, owner, title, settings, created_at, updated_at) "
                          "VALUES ('c1', 'me', 't', '{}', '2026-01-01', '2026-01-01')"))
        conn.execute(text("INSERT INTO documents (id, owner, chat_id, name, media_type, size_bytes, sha256, pages, "
                          "created_at) VALUES ('d1', 'me', 'c1', 'a.txt', 'text/plain', 1, :sha, '[\"p\"]', "
                          "'2026-01-01')"), {"sha": "0" * 64})
        conn.execute(text("INSERT INTO document_chunks (document_id, seq, page, text) "
                          "VALUES ('d1', 0, 1, 'the lighthouse keeper')"))
    db.migrate()
    store = DocumentStore(db, files)
    assert store.get("me", "d1").state == "indexed" and store.chunk_count("me", ["d1"]) == 1
    assert [h.text for h in store.by_words("me", ["d1"], ["lighthouse"], 5)] == ["the lighthouse keeper"]
    _downgrade(db, "0006")  # and back: the chat, its file and its passage are all still there
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM chats")).scalar() == 1
        assert conn.execute(text("SELECT rowid FROM document_chunks_fts WHERE document_chunks_fts MATCH "
                                 "'lighthouse'")).all() == [(1,)]
    db.close()


def _downgrade(db: Database, revision: str) -> None:
    with db.engine.begin() as connection:
        migrate_to(connection, revision, down=True)


def test_a_removed_account_takes_its_collections_with_it(database, files):
    from serge.store import AccountStore

    accounts = AccountStore(database)
    user = accounts.add_user("ada", "not-a-real-hash", admin=False)
    knowledge, indexer = service(database, files, HeldEmbedder())
    try:
        box = knowledge.create(user.id, "box")
        knowledge.upload(user.id, box.id, "a.md", b"the third stone")
        wait_for(lambda: knowledge.get(user.id, box.id).files_waiting == 0, what="indexing")
        accounts.remove_user("ada")
        assert knowledge.list(user.id) == []
        with database.session() as session:
            assert session.scalar(select(DocumentChunk.id)) is None
    finally:
        indexer.close()


def test_a_file_being_indexed_is_taken_by_no_other_indexer_until_its_claim_is_stale(database, files):
    """Several Serge processes on one database: a live claim is left alone, a dead indexer's is taken over."""
    from datetime import UTC, datetime, timedelta

    store = CollectionStore(DocumentStore(database, files))
    box = store.create("me", "box")
    doc = store.add_file("me", box.id, name="a.md", media_type="text/markdown", data=b"a")
    now = datetime.now(UTC)
    assert store.next_to_index(now - timedelta(minutes=2)).id == doc.id  # queued: taken, and claimed
    assert store.next_to_index(now - timedelta(minutes=2)) is None  # another indexer leaves it alone
    assert store.next_to_index(now + timedelta(minutes=2)).id == doc.id  # a stale claim: a dead one's
    store.release(doc.id)  # an indexer that stops lets go at once
    assert store.next_to_index(now - timedelta(minutes=2)).id == doc.id
