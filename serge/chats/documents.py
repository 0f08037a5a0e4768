"""A chat's documents: taking a file in, and choosing what of them the model sees for each question.

A file is read (`serge.documents.extract`), cut into passages, each embedded with the
embedding model (the engine's `embed`), and stored. For a reply, the documents
attached on the branch so far go in whole, each marked with its name, when they fit
the model's context beside the conversation with room left for the answer; else the
passages best for the question go in, with file and page: the nearest by meaning and
the best by words, their ranks fused (reciprocal rank fusion). The files of the
knowledge collections a chat or a message names are always searched, together with
the attached ones, in the same fusion. What went in is the reply's sources (file,
collection, page, passage, scores), kept with the message.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from serge.documents import (MAX_FILES_PER_CHAT, MAX_READERS, FileTooLarge, clean_name, extract, fuse, marked, passages,
                             query_words)
from serge.engine import Engine, Image, Message, read_image
from serge.store import ChunkHit, DocumentRecord, DocumentStore, NewChunk

log = logging.getLogger(__name__)

EMBED_BATCH = 64
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp")  # kept as images, for a vision model
CANDIDATES = 20  # passages each search brings to the fusion
TOP_PASSAGES = 6  # at most, into one prompt
REPLY_SHARE = 4  # a quarter of the context window stays free for the answer


@dataclass(frozen=True)
class Given:
    """What the model is given of the documents for one question: the text before it, and the sources."""

    text: str
    sources: list[dict]


@dataclass(frozen=True)
class Ranked:
    """A passage as the fusion placed it, with what each search said of it (None: that search did not find it)."""

    hit: ChunkHit
    score: float  # fused: the sum of 1 / (60 + rank)
    vector_rank: int | None
    vector_score: float | None  # cosine
    word_rank: int | None


def _whole(docs: Sequence[DocumentRecord]) -> str:
    return "Attached files:\n\n" + "\n\n".join(marked(d.name, d.pages) for d in docs)


def _passages(hits: list[tuple[str, int, str]]) -> str:
    parts = [f'<passage file="{name}" page="{page}">\n{text}\n</passage>' for name, page, text in hits]
    return "Passages from the attached files that may answer the question:\n\n" + "\n\n".join(parts)


def is_image(document: DocumentRecord) -> bool:
    return document.media_type.startswith("image/")


class ChatDocuments:
    def __init__(self, store: DocumentStore, engine: Engine) -> None:
        self.store, self.engine = store, engine
        self.readers = threading.BoundedSemaphore(MAX_READERS)  # a reader may take 1.5 GB: a few at a time

    # --- taking a file in ------------------------------------------------------------
    def vectors(self, texts: list[str]) -> list[np.ndarray | None]:
        """A vector per text; none (word search alone) where the embedding model cannot be used."""
        try:
            found = []
            for start in range(0, len(texts), EMBED_BATCH):
                found.extend(np.asarray(self.engine.embed(None, texts[start:start + EMBED_BATCH]).vectors,
                                        np.float32))
            return found
        except Exception as exc:  # no embedding model installed, or it failed: the file is still searchable
            log.warning("no vectors for a document (%s); it is searched by words only", exc)
            return [None] * len(texts)

    def attach(self, owner: str, chat_id: str, name: str, data: bytes) -> DocumentRecord:
        """Read, cut, embed and keep a file for the owner's chat; FileRefused says why not. An image is
        checked (`read_image`) and kept as it is, for a vision model: no text, no passages."""
        if len(self.store.list(owner, chat_id)) >= MAX_FILES_PER_CHAT:
            raise FileTooLarge(f"this chat has {MAX_FILES_PER_CHAT} files, the limit per chat; start a new chat")
        if name.lower().endswith(IMAGE_SUFFIXES):
            image = read_image(data, "file")
            return self.store.add(owner, chat_id, name=clean_name(name), media_type=image.media_type, data=data,
                                  pages=(), chunks=[])
        with self.readers:
            read = extract(data, name)
        cut = passages(read.pages)
        vectors = self.vectors([p.text for p in cut])
        return self.store.add(owner, chat_id, name=read.name, media_type=read.media_type, data=data,
                              pages=read.pages, chunks=[NewChunk(p.page, p.text, v) for p, v in zip(cut, vectors)])

    # --- what a reply is given ----------------------------------------------------------
    def _window(self, model: str) -> int:
        return self.engine.info(model).context_window or self.engine.settings.context_window or 4096

    def _tokens(self, model: str, history: list[Message]) -> int:
        try:
            return self.engine.count_tokens(model, history)
        except Exception:  # a remote model may not count: about four characters a token
            return sum(len(m.content or "") for m in history) // 4

    def images(self, owner: str, document_ids: Sequence[str]) -> tuple[Image, ...]:
        """The images among `document_ids`, read back from the store (checked again: nothing is trusted)."""
        return tuple(read_image(self.store.read(owner, d), "attachments") for d in document_ids
                     if is_image(self.store.get(owner, d)))

    def given(self, owner: str, model: str, document_ids: Sequence[str], history: list[Message],
              collections: dict[str, str] | None = None) -> Given:
        """What of `document_ids` (attached) and of `collections` (document id -> its collection's name) the model
        sees before the last message of `history` (the question). Attached files alone go in whole when they fit.
        Images are not told here: they go with their message (`images`)."""
        docs = {d: doc for d in dict.fromkeys(document_ids) if not is_image(doc := self.store.get(owner, d))}
        if not docs and not collections:
            return Given("", [])
        question = history[-1].content or ""
        window = self._window(model)
        room = window - window // REPLY_SHARE
        if not collections:
            whole = _whole(list(docs.values()))
            asked = [*history[:-1], Message("user", f"{whole}\n\n{question}")]
            if self._tokens(model, asked) <= room:
                return Given(whole, [{"document_id": d.id, "file": d.name, "collection": None, "page": None,
                                      "passage": None, "score": None, "whole": True} for d in docs.values()])
        labels = {d.id: (d.name, None) for d in docs.values()}
        in_collections = self.store.names(owner, [d for d in (collections or {}) if d not in labels])
        labels.update({d: (name, collections[d]) for d, name in in_collections.items()})
        return self._retrieved(owner, model, labels, history, room)

    def rank(self, owner: str, document_ids: Sequence[str], question: str) -> list[Ranked]:
        """The documents' passages for `question`, best first: the two searches' ranks fused."""
        vector = self.vectors([question])[0]
        by_meaning = self.store.by_meaning(owner, document_ids, vector, CANDIDATES) if vector is not None else []
        by_words = self.store.by_words(owner, document_ids, query_words(question), CANDIDATES)
        hits = {h.chunk_id: h for h in (*by_meaning, *by_words)}
        meaning = {h.chunk_id: (i, h.score) for i, h in enumerate(by_meaning, start=1)}
        words = {h.chunk_id: i for i, h in enumerate(by_words, start=1)}
        return [Ranked(hits[c], score, *meaning.get(c, (None, None)), words.get(c))
                for c, score in fuse([[h.chunk_id for h in by_meaning], [h.chunk_id for h in by_words]])]

    def _retrieved(self, owner: str, model: str, labels: dict[str, tuple[str, str | None]],
                   history: list[Message], room: int) -> Given:
        """The best passages that fit; `labels`: document id -> (file name, collection name or None)."""
        question = history[-1].content or ""
        chosen, sources = [], []
        for ranked in self.rank(owner, list(labels), question)[:TOP_PASSAGES]:
            hit = ranked.hit
            name, collection = labels[hit.document_id]
            trial = [*chosen, (name, hit.page, hit.text)]
            if chosen and self._tokens(model, [*history[:-1], Message("user", f"{_passages(trial)}\n\n{question}")]
                                       ) > room:
                break
            chosen = trial
            sources.append({"document_id": hit.document_id, "file": name, "collection": collection, "page": hit.page,
                            "passage": hit.text, "score": round(ranked.score, 6), "vector_rank": ranked.vector_rank,
                            "vector_score": None if ranked.vector_score is None else round(ranked.vector_score, 6),
                            "word_rank": ranked.word_rank, "whole": False})
        return Given(_passages(chosen) if chosen else "", sources)
