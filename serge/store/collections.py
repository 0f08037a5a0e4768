"""The collections repository: named sets of an owner's files, and the indexing state of each file.

A collection's file is kept as soon as it is uploaded (`queued`); an indexer takes
the oldest waiting file (`next_to_index`), writes its passages in batches, each
batch one transaction (`append`), and marks it `indexed`. So the database alone
says how far indexing got: a restart resumes a file after its last saved batch,
and a cancelled or deleted file stops taking batches. A file being indexed is
claimed (`claimed_at`, renewed by every batch, cleared by `release` when an indexer
stops): several Serge processes on one database never index the same file at once,
and a file whose indexer died is taken over once its claim is stale. The owner's methods take the
owner, and another owner's collection is "not found"; the indexer's take a file id.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import and_, case, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from serge.store.chats import new_id
from serge.store.documents import DocumentNotFound, DocumentRecord, DocumentStore, NewChunk, save_chunks
from serge.store.tables import Collection, Document, DocumentChunk, now

WAITING = ("queued", "indexing")


class CollectionNotFound(LookupError):
    pass


class CollectionExists(ValueError):
    """The owner already has a collection of that name."""


@dataclass(frozen=True)
class CollectionRecord:
    id: str
    name: str
    files: int
    files_indexed: int
    files_waiting: int  # queued or being indexed
    passages: int  # embedded and searchable so far
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class FileProgress:
    document: DocumentRecord
    passages: int  # saved so far, of document.chunks_total


class CollectionStore:
    def __init__(self, documents: DocumentStore) -> None:
        self.documents, self.db = documents, documents.db

    # --- the owner's --------------------------------------------------------------
    def _owned(self, session: Session, owner: str, collection_id: str) -> Collection:
        row = session.scalar(select(Collection).where(Collection.id == collection_id, Collection.owner == owner))
        if row is None:
            raise CollectionNotFound(f"no collection with id {collection_id!r}")
        return row

    def _records(self, session: Session, owner: str, *where) -> list[CollectionRecord]:
        passages = (select(Document.collection_id, func.count(DocumentChunk.id).label("n"))
                    .join(DocumentChunk, DocumentChunk.document_id == Document.id)
                    .where(Document.owner == owner, Document.collection_id.is_not(None))
                    .group_by(Document.collection_id).subquery())
        files = (select(Document.collection_id, func.count(Document.id).label("n"),
                        func.sum(case((Document.state == "indexed", 1), else_=0)).label("done"),
                        func.sum(case((Document.state.in_(WAITING), 1), else_=0)).label("waiting"))
                 .where(Document.owner == owner, Document.collection_id.is_not(None))
                 .group_by(Document.collection_id).subquery())
        stmt = (select(Collection, files.c.n, files.c.done, files.c.waiting, passages.c.n)
                .outerjoin(files, files.c.collection_id == Collection.id)
                .outerjoin(passages, passages.c.collection_id == Collection.id)
                .where(Collection.owner == owner, *where).order_by(Collection.name))
        return [CollectionRecord(c.id, c.name, n or 0, done or 0, waiting or 0, chunks or 0, c.created_at,
                                 c.updated_at) for c, n, done, waiting, chunks in session.execute(stmt)]

    def create(self, owner: str, name: str) -> CollectionRecord:
        try:
            with self.db.session() as session, session.begin():
                stamp = now()
                row = Collection(id=new_id(), owner=owner, name=name, created_at=stamp, updated_at=stamp)
                session.add(row)
        except IntegrityError:
            raise CollectionExists(f"you already have a collection named {name!r}; pick another name") from None
        return self.get(owner, row.id)

    def list(self, owner: str) -> list[CollectionRecord]:
        with self.db.session() as session:
            return self._records(session, owner)

    def get(self, owner: str, collection_id: str) -> CollectionRecord:
        with self.db.session() as session:
            found = self._records(session, owner, Collection.id == collection_id)
        if not found:
            raise CollectionNotFound(f"no collection with id {collection_id!r}")
        return found[0]

    def existing(self, owner: str, collection_ids: Sequence[str]) -> list[CollectionRecord]:
        """Those of the ids that still name one of the owner's collections (a chat may name a deleted one)."""
        wanted = set(collection_ids)
        return [c for c in self.list(owner) if c.id in wanted]

    def find(self, owner: str, refs: Sequence[str]) -> list[CollectionRecord]:
        """The owner's collections named by id or by name, in the order given; CollectionNotFound for any other."""
        mine = self.list(owner)
        by_ref = {**{c.name: c for c in mine}, **{c.id: c for c in mine}}
        missing = [r for r in refs if r not in by_ref]
        if missing:
            raise CollectionNotFound(f"you have no collection {missing[0]!r}; make it on the Knowledge page first")
        return list({by_ref[r].id: by_ref[r] for r in refs}.values())

    def rename(self, owner: str, collection_id: str, name: str) -> CollectionRecord:
        try:
            with self.db.session() as session, session.begin():
                row = self._owned(session, owner, collection_id)
                row.name, row.updated_at = name, now()
        except IntegrityError:
            raise CollectionExists(f"you already have a collection named {name!r}; pick another name") from None
        return self.get(owner, collection_id)

    def delete(self, owner: str, collection_id: str) -> None:
        """The collection, its files and passages, and the bytes no other document shares."""
        with self.db.session() as session, session.begin():
            self._owned(session, owner, collection_id)
        self.documents.delete_where(Document.owner == owner, Document.collection_id == collection_id)
        with self.db.session() as session, session.begin():
            session.delete(self._owned(session, owner, collection_id))

    def add_file(self, owner: str, collection_id: str, *, name: str, media_type: str, data: bytes) -> DocumentRecord:
        """Keep a file's bytes for the indexer: it waits, `queued`, with no text yet."""
        sha256 = self.documents.files.put(data)
        with self.db.session() as session, session.begin():
            collection = self._owned(session, owner, collection_id)
            row = Document(id=new_id(), owner=owner, collection_id=collection_id, name=name, media_type=media_type,
                           size_bytes=len(data), sha256=sha256, pages=[], state="queued", revision=0,
                           created_at=now())
            session.add(row)
            collection.updated_at = now()
        return DocumentRecord.of(row)

    def files(self, owner: str, collection_id: str) -> list[FileProgress]:
        done = (select(DocumentChunk.document_id, func.count(DocumentChunk.id).label("n"))
                .group_by(DocumentChunk.document_id).subquery())
        stmt = (select(Document, done.c.n).outerjoin(done, done.c.document_id == Document.id)
                .where(Document.owner == owner, Document.collection_id == collection_id)
                .order_by(Document.created_at, Document.id))
        with self.db.session() as session:
            self._owned(session, owner, collection_id)
            return [FileProgress(DocumentRecord.of(row), n or 0) for row, n in session.execute(stmt)]

    def delete_file(self, owner: str, collection_id: str, document_id: str) -> None:
        with self.db.session() as session:
            self._owned(session, owner, collection_id)
            if session.scalar(select(Document.id).where(Document.id == document_id, Document.owner == owner,
                                                        Document.collection_id == collection_id)) is None:
                raise DocumentNotFound(f"collection {collection_id!r} has no file {document_id!r}")
        self.documents.delete_where(Document.id == document_id, Document.owner == owner)

    def _set_files(self, owner: str, collection_id: str, where, **values) -> int:
        with self.db.session() as session, session.begin():
            self._owned(session, owner, collection_id)
            return session.execute(update(Document).where(
                Document.owner == owner, Document.collection_id == collection_id, where).values(**values)).rowcount

    def reindex(self, owner: str, collection_id: str) -> int:
        """Every file read and embedded again (after a failure, or with another embedding model); how many."""
        with self.db.session() as session, session.begin():
            self._owned(session, owner, collection_id)
            ids = select(Document.id).where(Document.owner == owner, Document.collection_id == collection_id)
            session.execute(DocumentChunk.__table__.delete().where(DocumentChunk.document_id.in_(ids)))
            return session.execute(update(Document).where(Document.id.in_(ids)).values(
                state="queued", error=None, pages=[], chunks_total=None, revision=Document.revision + 1)).rowcount

    def cancel(self, owner: str, collection_id: str) -> int:
        """Files still waiting or being indexed stop (what they saved stays searchable); how many."""
        return self._set_files(owner, collection_id, Document.state.in_(WAITING), state="cancelled")

    def searchable(self, owner: str, collection_ids: Sequence[str]) -> dict[str, str]:
        """document id -> collection id, for the files of these collections that have passages."""
        stmt = (select(Document.id, Document.collection_id).where(
            Document.owner == owner, Document.collection_id.in_(list(collection_ids)),
            Document.id.in_(select(DocumentChunk.document_id))))
        with self.db.session() as session:
            return dict(session.execute(stmt).all())

    # --- the indexer's ------------------------------------------------------------
    def next_to_index(self, stale_before: datetime) -> DocumentRecord | None:
        """The oldest file waiting (one cut off mid-file first: released, or claimed before `stale_before`), now
        marked `indexing` and claimed."""
        free = or_(Document.state == "queued", and_(Document.state == "indexing", or_(
            Document.claimed_at.is_(None), Document.claimed_at < stale_before)))
        with self.db.session() as session, session.begin():
            row = session.scalar(select(Document).where(free)
                                 .order_by(case((Document.state == "indexing", 0), else_=1), Document.created_at,
                                           Document.id).limit(1).with_for_update(skip_locked=True))
            if row is None:
                return None
            row.state, row.claimed_at = "indexing", now()
        return DocumentRecord.of(row)

    def release(self, document_id: str) -> None:
        """The indexer stops with the file unfinished: the next one may take it at once."""
        with self.db.session() as session, session.begin():
            session.execute(update(Document).where(Document.id == document_id).values(claimed_at=None))

    def read_done(self, document_id: str, pages: Sequence[str], chunks_total: int) -> None:
        with self.db.session() as session, session.begin():
            session.execute(update(Document).where(Document.id == document_id, Document.state == "indexing")
                            .values(pages=list(pages), chunks_total=chunks_total, claimed_at=now()))

    def passages_saved(self, document_id: str) -> int:
        with self.db.session() as session:
            return session.scalar(select(func.count(DocumentChunk.id))
                                  .where(DocumentChunk.document_id == document_id)) or 0

    def append(self, document_id: str, first_seq: int, chunks: Sequence[NewChunk]) -> bool:
        """Save a batch of passages, if the file is still being indexed; False once it is not (cancelled, gone)."""
        with self.db.session() as session, session.begin():
            moved = session.execute(update(Document).where(Document.id == document_id, Document.state == "indexing")
                                    .values(revision=Document.revision + 1, claimed_at=now())).rowcount
            if not moved:
                return False
            save_chunks(self.db, session, document_id, first_seq, chunks)
        return True

    def finish(self, document_id: str, error: str | None = None) -> None:
        """`indexed`, or `failed` with the reason, unless it was cancelled meanwhile."""
        with self.db.session() as session, session.begin():
            session.execute(update(Document).where(Document.id == document_id, Document.state == "indexing")
                            .values(state="failed" if error else "indexed", error=error, claimed_at=None))
