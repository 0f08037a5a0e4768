"""`Indexer`: the one thread that reads, cuts and embeds the files of collections, in the background.

Its only job is to empty the queue the database holds (`CollectionStore.next_to_index`):
each file is read, cut into passages and embedded a batch at a time, each batch saved
before the next is embedded. It keeps no state of its own beyond its thread: a
restart finds the file it was on still `indexing` and goes on after its last saved
batch (reading and cutting are deterministic, so passage n is the same passage), and
a cancel or a delete is seen by the next save, which the store then refuses.
`wake()` after a change; `close()` stops it between two batches, releases the file it
was on (so the next start takes it at once) and joins it. A file whose indexer died
without a word (a killed process) is taken over once its claim is `lease_s` old.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta

from serge.chats.documents import EMBED_BATCH, ChatDocuments
from serge.documents import FileRefused, extract, passages
from serge.store import CollectionStore, DocumentRecord, NewChunk

log = logging.getLogger(__name__)

IDLE_POLL_S = 30.0  # another process on the same database may queue files: look now and then
LEASE_S = 120.0  # a claim older than this is a dead indexer's (a batch of passages takes seconds)


class Indexer:
    def __init__(self, store: CollectionStore, documents: ChatDocuments, lease_s: float = LEASE_S) -> None:
        self.store, self.documents, self.lease = store, documents, timedelta(seconds=lease_s)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="serge-indexer", daemon=True)

    def start(self) -> Indexer:
        self._thread.start()
        return self

    def wake(self) -> None:
        self._wake.set()

    def close(self, timeout: float = 60.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                job = self.store.next_to_index(datetime.now(UTC) - self.lease)
            except Exception:
                log.exception("the indexer could not read its queue; trying again shortly")
                job = None
            if job is None:
                self._wake.wait(IDLE_POLL_S)
                self._wake.clear()
                continue
            try:
                if not self._index(job):
                    self.store.release(job.id)
            except FileRefused as exc:
                self.store.finish(job.id, error=str(exc))
            except Exception as exc:
                log.exception("indexing %s failed", job.name)
                self.store.finish(job.id, error=f"could not index {job.name}: {exc}")

    def _index(self, job: DocumentRecord) -> bool:
        """False when it stopped before the end (closing, or the file was cancelled or deleted)."""
        data = self.store.documents.files.path(job.sha256).read_bytes()
        with self.documents.readers:
            pages = job.pages or extract(data, job.name).pages
        cut = passages(pages)
        self.store.read_done(job.id, pages, len(cut))
        start = self.store.passages_saved(job.id)  # after a restart: what the last run saved
        for first in range(start, len(cut), EMBED_BATCH):
            if self._stop.is_set():
                return False  # still `indexing`: the next start goes on from here
            batch = cut[first:first + EMBED_BATCH]
            vectors = self.documents.vectors([p.text for p in batch])
            if not self.store.append(job.id, first, [NewChunk(p.page, p.text, v) for p, v in zip(batch, vectors)]):
                return False  # cancelled or deleted meanwhile
        self.store.finish(job.id)
        return True
