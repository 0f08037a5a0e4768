"""The documents repository: files given to a chat or a collection (bytes kept once by their hash), their
passages, and search.

Every method takes the owner; another owner's document is "not found", except that the searches
(`names`, `by_meaning`, `by_words`) also read the files of collections shared with them. A file's
bytes live in the data dir under their SHA-256 (`FileStore`), never under a name
a request gave, and go when the last document with that hash does. Search comes
in two rankings of one chat's passages, whatever the database: by meaning (cosine
of the vectors) and by words (SQLite's FTS5 with BM25; PostgreSQL's full-text search
with ts_rank over a stored tsvector).
Each document's vectors are kept in memory as one normalised matrix (`Vectors`) while
its `revision` holds, scored with numpy, so a search reads two small columns from the
database, not every vector. A document not kept yet is read into memory first; where
the SQLite connection has sqlite-vec (`Database.sqlite_vec`), it is instead scored inside
SQLite (vec_distance_cosine over the same column: a third to a half of the time of reading it out),
or inside PostgreSQL where its pgvector column exists (`Database.pgvector`, migration 0008),
and read into memory by a thread of its own for the next search.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
from sqlalchemy import bindparam, delete, func, literal_column, or_, select, text
from sqlalchemy.orm import Session

from serge.store.chats import new_id
from serge.store.db import Database, private_dir
from serge.store.tables import FULL_TEXT_COLUMN, CollectionShare, Document, DocumentChunk, GroupMember, now

EVERYONE = "*"  # a collection share's group id that shares it with everyone

log = logging.getLogger(__name__)


class DocumentNotFound(LookupError):
    pass


VECTOR_CACHE_BYTES = 512 * 2**20  # of passage vectors kept in memory, least recently searched dropped first



def shared_collections(user: str):
    """The ids of the collections shared with `user`: with a group of theirs, or with everyone (a select)."""
    return select(CollectionShare.collection_id).where(or_(
        CollectionShare.group_id == EVERYONE,
        CollectionShare.group_id.in_(select(GroupMember.group_id).where(GroupMember.user_id == user))))


def readable(user: str):
    """The documents `user` may read: their own, and the files of collections shared with them (read-only)."""
    return or_(Document.owner == user, Document.collection_id.in_(shared_collections(user)))

@dataclass(frozen=True)
class DocumentRecord:
    id: str
    chat_id: str | None  # one of the two: the chat it was given to,
    collection_id: str | None  # or the collection it belongs to
    name: str
    media_type: str
    size_bytes: int
    sha256: str
    pages: tuple[str, ...]
    state: str  # queued, indexing, indexed, failed or cancelled
    error: str | None
    chunks_total: int | None
    created_at: datetime

    @classmethod
    def of(cls, row: Document) -> DocumentRecord:
        return cls(id=row.id, chat_id=row.chat_id, collection_id=row.collection_id, name=row.name,
                   media_type=row.media_type, size_bytes=row.size_bytes, sha256=row.sha256,
                   pages=tuple(row.pages or ()), state=row.state or "indexed", error=row.error,
                   chunks_total=row.chunks_total, created_at=row.created_at)


@dataclass(frozen=True)
class NewChunk:
    page: int
    text: str
    vector: np.ndarray | None  # float32


@dataclass(frozen=True)
class ChunkHit:
    chunk_id: int
    document_id: str
    page: int
    text: str
    score: float  # cosine similarity, or the word search's relevance (higher is better either way)


def vector_text(vector: np.ndarray) -> str:
    """A float32 vector in pgvector's text form, every float32 exact."""
    return "[" + ",".join(map(str, np.asarray(vector, dtype=np.float32).tolist())) + "]"


def save_chunks(db: Database, session: Session, document_id: str, first_seq: int, chunks: Sequence[NewChunk]) -> None:
    """A document's passages, numbered from `first_seq`, their vectors as float32 bytes (and in pgvector's
    column where the database has it)."""
    vectors = [None if c.vector is None else np.asarray(c.vector, dtype=np.float32) for c in chunks]
    rows = [DocumentChunk(document_id=document_id, seq=first_seq + i, page=c.page, text=c.text,
                          embedding=None if v is None else v.tobytes())
            for i, (c, v) in enumerate(zip(chunks, vectors))]
    session.add_all(rows)
    if db.pgvector:
        session.flush()
        vectors = [{"id": row.id, "v": vector_text(v)} for row, v in zip(rows, vectors) if v is not None]
        if vectors:
            session.execute(text("UPDATE document_chunks SET embedding_vector = CAST(:v AS vector) WHERE id = :id"),
                            vectors)


class FileStore:
    """Files by content: `put` keeps bytes once under their SHA-256, readable by their owner alone."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, sha256: str) -> Path:
        if not re.fullmatch(r"[0-9a-f]{64}", sha256):
            raise ValueError("not a SHA-256")
        return self.root / sha256[:2] / sha256

    def put(self, data: bytes) -> str:
        sha256 = hashlib.sha256(data).hexdigest()
        target = self.path(sha256)
        if not target.exists():
            # resolved: a `files` link to a shared folder not made yet (another process's, docs/several-processes.md)
            # makes that folder, where mkdir on the link itself raised FileExistsError
            private_dir(self.root.resolve())
            private_dir(target.parent.resolve())
            # a name of its own per upload (mkstemp, 0600): two uploads of the same bytes at once, in one process or
            # two, each write their own and the second rename puts the same bytes in place
            fd, partial = tempfile.mkstemp(prefix=f"{sha256}.", suffix=".part", dir=target.parent.resolve())
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(partial, target)
        return sha256

    def remove(self, sha256: str) -> None:
        self.path(sha256).unlink(missing_ok=True)


class Vectors:
    """Each document's passage vectors as one normalised matrix, in memory while the document's revision holds."""

    def __init__(self, budget_bytes: int = VECTOR_CACHE_BYTES) -> None:
        self.budget = budget_bytes
        self._kept: OrderedDict[str, tuple[int, np.ndarray, np.ndarray]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._reader: threading.Thread | None = None

    def kept(self, document_id: str, revision: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(chunk ids, unit-length vectors) of the document if they are in memory at this revision."""
        with self._lock:
            kept = self._kept.get(document_id)
            if kept is None or kept[0] != revision:
                return None
            self._kept.move_to_end(document_id)
            return kept[1], kept[2]

    def read(self, session: Session, document_id: str, revision: int) -> tuple[np.ndarray, np.ndarray]:
        """Read the document's passages that have a vector into memory: (chunk ids, unit-length vectors)."""
        rows = session.execute(select(DocumentChunk.id, DocumentChunk.embedding).where(
            DocumentChunk.document_id == document_id, DocumentChunk.embedding.is_not(None))
            .order_by(DocumentChunk.id)).all()
        ids = np.array([r[0] for r in rows], dtype=np.int64)
        matrix = (np.stack([np.frombuffer(r[1], dtype=np.float32) for r in rows]) if rows
                  else np.zeros((0, 0), dtype=np.float32))
        if rows:
            matrix = matrix / (np.linalg.norm(matrix, axis=1, keepdims=True) + 1e-12)
        with self._lock:
            old = self._kept.pop(document_id, None)
            self._bytes -= old[2].nbytes if old is not None else 0
            self._kept[document_id] = (revision, ids, matrix)
            self._bytes += matrix.nbytes
            while self._bytes > self.budget and len(self._kept) > 1:
                _, (_, _, dropped) = self._kept.popitem(last=False)
                self._bytes -= dropped.nbytes
        return ids, matrix

    def read_later(self, db: Database, wanted: Sequence[tuple[str, int]]) -> None:
        """Read these (document, revision)s into memory in a thread, unless one is still reading: the next
        search scores what it finds kept, the rest again in the database."""
        with self._lock:
            if self._reader is not None and self._reader.is_alive():
                return
            self._reader = threading.Thread(target=self._read_all, args=(db, list(wanted)),
                                            name="serge-vectors", daemon=True)
            self._reader.start()

    def _read_all(self, db: Database, wanted: list[tuple[str, int]]) -> None:
        try:
            with db.session() as session:
                for document_id, revision in wanted:
                    self.read(session, document_id, revision)
        except Exception as exc:  # a database closed or busy: nothing is kept, nothing else is harmed
            log.warning("passages' vectors were not read into memory: %s", exc)

    def settle(self) -> None:
        """Wait for the vectors being read into memory, if any."""
        reader = self._reader
        if reader is not None:
            reader.join()


class DocumentStore:
    def __init__(self, db: Database, files: FileStore) -> None:
        self.db, self.files = db, files
        self.vectors = Vectors()

    def _owned(self, session: Session, owner: str, document_id: str) -> Document:
        row = session.scalar(select(Document).where(Document.id == document_id, Document.owner == owner))
        if row is None:
            raise DocumentNotFound(f"no document with id {document_id!r}")
        return row

    def add(self, owner: str, chat_id: str, *, name: str, media_type: str, data: bytes, pages: Sequence[str],
            chunks: Sequence[NewChunk]) -> DocumentRecord:
        """Keep the file's bytes (once per content) and its text and passages; the chat must be the owner's."""
        sha256 = self.files.put(data)
        with self.db.session() as session, session.begin():
            row = Document(id=new_id(), owner=owner, chat_id=chat_id, name=name, media_type=media_type,
                           size_bytes=len(data), sha256=sha256, pages=list(pages), created_at=now())
            session.add(row)
            session.flush()
            save_chunks(self.db, session, row.id, 0, chunks)
        return DocumentRecord.of(row)

    def get(self, owner: str, document_id: str) -> DocumentRecord:
        with self.db.session() as session:
            return DocumentRecord.of(self._owned(session, owner, document_id))

    def list(self, owner: str, chat_id: str) -> list[DocumentRecord]:
        stmt = (select(Document).where(Document.owner == owner, Document.chat_id == chat_id)
                .order_by(Document.created_at, Document.id))
        with self.db.session() as session:
            return [DocumentRecord.of(row) for row in session.scalars(stmt)]

    def names(self, owner: str, document_ids: Sequence[str]) -> dict[str, str]:
        """document id -> file name, without reading the files' text."""
        with self.db.session() as session:
            return dict(session.execute(select(Document.id, Document.name).where(
                readable(owner), Document.id.in_(list(document_ids)))).all())

    def read(self, owner: str, document_id: str) -> bytes:
        return self.files.path(self.get(owner, document_id).sha256).read_bytes()

    def delete_chat(self, owner: str, chat_id: str) -> None:
        """Every document of the chat, and the bytes no other document shares."""
        self.delete_where(Document.owner == owner, Document.chat_id == chat_id)

    def delete_where(self, *where) -> None:
        """The documents `where` selects, their passages, and the bytes no other document shares."""
        with self.db.session() as session, session.begin():
            rows = list(session.scalars(select(Document).where(*where)))
            ids = [r.id for r in rows]
            session.execute(delete(DocumentChunk).where(DocumentChunk.document_id.in_(ids)))
            session.execute(delete(Document).where(Document.id.in_(ids)))
            hashes = {r.sha256 for r in rows}
            kept = set(session.scalars(select(Document.sha256).where(Document.sha256.in_(hashes))))
        for sha256 in hashes - kept:
            self.files.remove(sha256)

    def chunk_count(self, owner: str, document_ids: Sequence[str]) -> int:
        with self.db.session() as session:
            return session.scalar(select(func.count(DocumentChunk.id)).join(Document).where(
                Document.owner == owner, Document.id.in_(list(document_ids)))) or 0

    def _hits(self, session: Session, ids_scores: Sequence[tuple[int, float]]) -> list[ChunkHit]:
        rows = {r.id: r for r in session.scalars(select(DocumentChunk).where(
            DocumentChunk.id.in_([i for i, _ in ids_scores])))}
        return [ChunkHit(i, rows[i].document_id, rows[i].page, rows[i].text, float(score))
                for i, score in ids_scores if i in rows]

    def by_meaning(self, owner: str, document_ids: Sequence[str], vector: np.ndarray, limit: int) -> list[ChunkHit]:
        """The passages nearest `vector` (cosine), best first; ties by document, then passage."""
        stmt = (select(Document.id, Document.revision).where(readable(owner), Document.id.in_(list(document_ids)))
                .order_by(Document.id))
        query = np.asarray(vector, dtype=np.float32)
        query = query / (np.linalg.norm(query) + 1e-12)
        found: list[tuple[float, str, int]] = []  # (cosine, document id, chunk id)
        with self.db.session() as session:
            missed = []
            for document_id, revision in session.execute(stmt).all():
                kept = self.vectors.kept(document_id, revision)
                if kept is None and (self.db.sqlite_vec or self.db.pgvector):
                    missed.append((document_id, revision))
                    continue
                ids, matrix = kept if kept is not None else self.vectors.read(session, document_id, revision)
                if len(ids) and matrix.shape[1] == len(query):
                    scores = matrix @ query
                    top = np.argpartition(-scores, limit)[:limit] if len(scores) > limit else range(len(scores))
                    found.extend((float(scores[i]), document_id, int(ids[i])) for i in top)
            if missed:
                found.extend(self._by_meaning_in_database(session, [d for d, _ in missed], query, limit))
                self.vectors.read_later(self.db, missed)
            # numpy's and sqlite-vec's float32 sums differ in the 7th digit: a tie is one to 6 digits,
            # so the order is the same whoever scored which document
            best = sorted(found, key=lambda f: (-round(f[0], 6), f[1], f[2]))[:limit]
            return self._hits(session, [(chunk_id, score) for score, _, chunk_id in best])

    def _by_meaning_in_database(self, session: Session, document_ids: list[str], query: np.ndarray,
                                limit: int) -> list[tuple[float, str, int]]:
        """sqlite-vec's or pgvector's best `limit` passages of these documents: (cosine, document id, chunk id)."""
        if self.db.pgvector:
            # pgvector's cosine distance of a zero vector is NaN, which PostgreSQL sorts above every number
            sql = ("SELECT score, document_id, id FROM (SELECT 1 - coalesce(nullif(embedding_vector <=> "
                   "CAST(:query AS vector), 'NaN'), 1) AS score, document_id, id FROM document_chunks "
                   "WHERE document_id IN :ids AND vector_dims(embedding_vector) = :size) AS scored "
                   "ORDER BY round(CAST(score AS numeric), 6) DESC, document_id, id LIMIT :limit")
            values = {"query": vector_text(query), "size": len(query), "limit": limit}
        else:
            sql = ("SELECT 1 - coalesce(vec_distance_cosine(embedding, :query), 1) AS score, document_id, id "
                   "FROM document_chunks WHERE document_id IN :ids AND length(embedding) = :size "
                   "ORDER BY round(score, 6) DESC, document_id, id LIMIT :limit")
            values = {"query": query.tobytes(), "size": query.nbytes, "limit": limit}
        rows = session.execute(text(sql).bindparams(bindparam("ids", document_ids, expanding=True)), values).all()
        return [(float(score), document_id, int(chunk_id)) for score, document_id, chunk_id in rows]

    def by_words(self, owner: str, document_ids: Sequence[str], words: Sequence[str], limit: int) -> list[ChunkHit]:
        """The passages that share the most telling of `words` (lower-case letters and digits), best first."""
        words = [w for w in words if re.fullmatch(r"\w+", w)]
        if not words or not document_ids:
            return []
        ids = list(document_ids)
        with self.db.session() as session:
            own = select(Document.id).where(readable(owner), Document.id.in_(ids))
            ids = list(session.scalars(own))  # those `owner` may read (a shared collection's files too)
            if not ids:
                return []
            if self.db.engine.dialect.name == "sqlite":
                match = " OR ".join(f'"{w}"' for w in words)
                rows = session.execute(text(
                    "SELECT f.rowid, -bm25(document_chunks_fts) FROM document_chunks_fts f "
                    "JOIN document_chunks c ON c.id = f.rowid "
                    "WHERE document_chunks_fts MATCH :match AND c.document_id IN :ids "
                    "ORDER BY bm25(document_chunks_fts) LIMIT :limit"
                ).bindparams(bindparam("ids", ids, expanding=True), match=match, limit=limit)).all()
            else:
                vector = literal_column(f"document_chunks.{FULL_TEXT_COLUMN}")
                tsquery = func.to_tsquery("simple", " | ".join(words))
                rank = func.ts_rank(vector, tsquery)
                rows = session.execute(
                    select(DocumentChunk.id, rank).where(DocumentChunk.document_id.in_(ids), vector.op("@@")(tsquery))
                    .order_by(rank.desc(), DocumentChunk.id).limit(limit)).all()
            return self._hits(session, [(r[0], r[1]) for r in rows])
