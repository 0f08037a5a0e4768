"""The collections repository: named sets of an owner's files, and the indexing state of each file.

A collection's file is kept as soon as it is uploaded (`queued`); an indexer takes
the oldest waiting file (`next_to_index`), writes its passages in batches, each
batch one transaction (`append`), and marks it `indexed`. So the database alone
says how far indexing got: a restart resumes a file after its last saved batch,
and a cancelled or deleted file stops taking batches. A file being indexed is
claimed (`claimed_at`, renewed by every batch, cleared by `release` when an indexer
stops): several Serge processes on one database never index the same file at once,
and a file whose indexer died is taken over once its claim is stale. The reading methods (`list`, `get`,
`find`, `files`, `searchable`) take the user reading: their own collections and those shared with them
(with a group of theirs, or with everyone: `collection_shares`); any other is "not found". The changing
methods take the collection's owner (who may change a shared one is `serge.chats.knowledge`'s to say);
the indexer's take a file id.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import and_, case, delete as sql_delete, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from serge.store.chats import new_id
from serge.store.documents import (EVERYONE, DocumentNotFound, DocumentRecord, DocumentStore, NewChunk, save_chunks,
                                   shared_collections)
from serge.store.people.groups import GroupNotFound
from serge.store.tables import Collection, CollectionShare, Document, DocumentChunk, UserGroup, now

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
    owner: str = ""  # the owning user's id
    shared_groups: tuple[str, ...] = ()  # the groups it is shared with, by name
    shared_with_everyone: bool = False


def _visible(user: str):
    """The collections `user` may read: their own, and those shared with them."""
    return or_(Collection.owner == user, Collection.id.in_(shared_collections(user)))


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

    def _records(self, session: Session, user: str, *where) -> list[CollectionRecord]:
        """`user`'s own collections and those shared with them, that `where` lets through."""
        visible = select(Collection.id).where(_visible(user), *where)
        passages = (select(Document.collection_id, func.count(DocumentChunk.id).label("n"))
                    .join(DocumentChunk, DocumentChunk.document_id == Document.id)
                    .where(Document.collection_id.in_(visible))
                    .group_by(Document.collection_id).subquery())
        files = (select(Document.collection_id, func.count(Document.id).label("n"),
                        func.sum(case((Document.state == "indexed", 1), else_=0)).label("done"),
                        func.sum(case((Document.state.in_(WAITING), 1), else_=0)).label("waiting"))
                 .where(Document.collection_id.in_(visible))
                 .group_by(Document.collection_id).subquery())
        stmt = (select(Collection, files.c.n, files.c.done, files.c.waiting, passages.c.n)
                .outerjoin(files, files.c.collection_id == Collection.id)
                .outerjoin(passages, passages.c.collection_id == Collection.id)
                .where(_visible(user), *where).order_by(Collection.name, Collection.owner != user, Collection.id))
        found = session.execute(stmt).all()
        groups: dict[str, list[str]] = {}
        for collection_id, group_id, group in session.execute(
                select(CollectionShare.collection_id, CollectionShare.group_id, UserGroup.name)
                .outerjoin(UserGroup, UserGroup.id == CollectionShare.group_id)
                .where(CollectionShare.collection_id.in_([c.id for c, *_ in found]))):
            groups.setdefault(collection_id, []).append(EVERYONE if group_id == EVERYONE else group)
        return [CollectionRecord(c.id, c.name, n or 0, done or 0, waiting or 0, chunks or 0, c.created_at,
                                 c.updated_at, c.owner, tuple(sorted(g for g in groups.get(c.id, ()) if g != EVERYONE)),
                                 EVERYONE in groups.get(c.id, ()))
                for c, n, done, waiting, chunks in found]

    def create(self, owner: str, name: str) -> CollectionRecord:
        try:
            with self.db.session() as session, session.begin():
                stamp = now()
                row = Collection(id=new_id(), owner=owner, name=name, created_at=stamp, updated_at=stamp)
                session.add(row)
        except IntegrityError:
            raise CollectionExists(f"you already have a collection named {name!r}; pick another name") from None
        return self.get(owner, row.id)

    def list(self, user: str) -> list[CollectionRecord]:
        """`user`'s own collections and those shared with them, by name (theirs first on a tie)."""
        with self.db.session() as session:
            return self._records(session, user)

    def get(self, user: str, collection_id: str) -> CollectionRecord:
        with self.db.session() as session:
            found = self._records(session, user, Collection.id == collection_id)
        if not found:
            raise CollectionNotFound(f"no collection with id {collection_id!r}")
        return found[0]

    def existing(self, user: str, collection_ids: Sequence[str]) -> list[CollectionRecord]:
        """Those of the ids that still name a collection `user` may read (a chat may name a deleted one, or one
        no longer shared with them)."""
        wanted = set(collection_ids)
        return [c for c in self.list(user) if c.id in wanted]

    def find(self, user: str, refs: Sequence[str]) -> list[CollectionRecord]:
        """The collections `user` may read named by id or by name (their own first where a shared one has the
        same name), in the order given; CollectionNotFound for any other."""
        mine = self.list(user)
        by_ref = {**{c.name: c for c in reversed(mine)}, **{c.id: c for c in mine}}
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
        """The collection, its files and passages, its shares, and the bytes no other document shares."""
        with self.db.session() as session, session.begin():
            self._owned(session, owner, collection_id)
        self.documents.delete_where(Document.owner == owner, Document.collection_id == collection_id)
        with self.db.session() as session, session.begin():
            session.execute(sql_delete(CollectionShare).where(CollectionShare.collection_id == collection_id))
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

    def files(self, user: str, collection_id: str) -> list[FileProgress]:
        done = (select(DocumentChunk.document_id, func.count(DocumentChunk.id).label("n"))
                .group_by(DocumentChunk.document_id).subquery())
        stmt = (select(Document, done.c.n).outerjoin(done, done.c.document_id == Document.id)
                .where(Document.collection_id == collection_id)
                .order_by(Document.created_at, Document.id))
        with self.db.session() as session:
            if session.scalar(select(Collection.id).where(Collection.id == collection_id, _visible(user))) is None:
                raise CollectionNotFound(f"no collection with id {collection_id!r}")
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

    def searchable(self, user: str, collection_ids: Sequence[str]) -> dict[str, str]:
        """document id -> collection id, for the files that have passages of those of these collections `user`
        may read."""
        stmt = (select(Document.id, Document.collection_id).where(
            Document.collection_id.in_(select(Collection.id).where(Collection.id.in_(list(collection_ids)),
                                                                   _visible(user))),
            Document.id.in_(select(DocumentChunk.document_id))))
        with self.db.session() as session:
            return dict(session.execute(stmt).all())

    # --- sharing (the owner's) -------------------------------------------------------
    def set_shares(self, owner: str, collection_id: str, groups: Sequence[str], everyone: bool) -> CollectionRecord:
        """Share the owner's collection with exactly these groups (by name; GroupNotFound for an unknown one) and,
        if `everyone`, with every user; none and not everyone: the owner's alone again."""
        with self.db.session() as session, session.begin():
            self._owned(session, owner, collection_id)
            ids = {}
            for name in groups:
                found = session.scalar(select(UserGroup.id).where(UserGroup.name == name))
                if found is None:
                    raise GroupNotFound(f"there is no group named {name!r}")
                ids[found] = name
            session.execute(sql_delete(CollectionShare).where(CollectionShare.collection_id == collection_id))
            for group_id in [*ids, *([EVERYONE] if everyone else [])]:
                session.add(CollectionShare(collection_id=collection_id, group_id=group_id))
        return self.get(owner, collection_id)

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
