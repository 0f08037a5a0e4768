"""One assistant reply being generated: read from the engine, saved as it grows.

A `Reply` owns a thread that reads the engine's `Stream` to the end, whoever is
listening: the text is written to the database about once a second, and the
final text, token counts, timings and finish reason when the stream ends. So a
page that closes, a `/stop`, or an engine error all leave a saved (incomplete)
reply, and a server killed mid-reply leaves at most a second of text unsaved.
Listeners read the deltas and then the saved message through `events()`.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable

from serge.engine import FinishReason, GenerationRecord, Stream
from serge.store import ChatStore, MessageRecord

log = logging.getLogger(__name__)

FLUSH_EVERY_S = 1.0
QUEUE_POLL_S = 0.5  # how often a waiting reply re-reads its place in line
COMPLETE = {FinishReason.STOP, FinishReason.LENGTH}


class Reply:
    def __init__(self, store: ChatStore, owner: str, chat_id: str, message: MessageRecord,
                 user_message: MessageRecord | None, stream: Stream,
                 on_done: Callable[[Reply], None]) -> None:
        self.owner, self.chat_id = owner, chat_id
        self.message_id = message.id
        self.user_message = user_message
        self.stream = stream
        self._store = store
        self._on_done = on_done
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._final: MessageRecord | None = None
        self._placeholder = message
        self._thread = threading.Thread(target=self._run, name=f"serge-reply-{chat_id[:8]}", daemon=True)

    def start(self) -> Reply:
        self._thread.start()
        return self

    @property
    def finished(self) -> bool:
        return self._final is not None

    def cancel(self) -> None:
        self.stream.cancel()

    def wait(self, timeout: float = 60.0) -> MessageRecord | None:
        """Block until the reply is saved for good; returns the saved message."""
        self._thread.join(timeout)
        return self._final

    async def events(self) -> AsyncIterator[tuple[str, object]]:
        """("queued", requests ahead) while it waits for a slot, ("delta", text) for each piece
        of the reply, then ("done", the saved MessageRecord)."""
        told: int | None = None
        while True:
            try:
                kind, value = self._events.get_nowait()
            except queue.Empty:
                position = self.stream.queue_position
                if position is not None and position != told:
                    told = position
                    yield "queued", position
                try:
                    kind, value = await asyncio.to_thread(self._events.get, timeout=QUEUE_POLL_S)
                except queue.Empty:
                    continue
            yield kind, value
            if kind == "done":
                return

    # --- the reply's own thread -------------------------------------------------
    def _run(self) -> None:
        parts: list[str] = []
        flushed = time.monotonic()
        try:
            for delta in self.stream:
                parts.append(delta)
                self._events.put(("delta", delta))
                if time.monotonic() - flushed >= FLUSH_EVERY_S:
                    self._store.save_text(self.owner, self.message_id, "".join(parts))
                    flushed = time.monotonic()
        except Exception:  # a failed flush: stop generating, keep what we have
            log.exception("saving reply %s failed", self.message_id)
            self.stream.cancel()
        finally:
            try:
                record = self.stream.close()
            except Exception as exc:
                record = None
                log.error("reply %s: %s", self.message_id, exc)
            self._final = self._save(record, "".join(parts))
            try:
                self._on_done(self)
            finally:
                self._events.put(("done", self._final))

    def _save(self, record: GenerationRecord | None, text: str) -> MessageRecord:
        if record is None:
            values = dict(content=text, finish_reason="error", complete=False,
                          error="the model worker did not stop in time")
        else:
            values = dict(
                content=record.text or text,
                prompt_tokens=record.prompt_tokens,
                completion_tokens=record.completion_tokens,
                seed=str(record.seed),
                queued_s=record.queued_s,
                ttft_s=record.ttft_s,
                duration_s=record.duration_s,
                tokens_per_s=record.tokens_per_s,
                finish_reason=record.finish_reason.value,
                complete=record.finish_reason in COMPLETE,
                error=record.error,
            )
        try:
            return self._store.finish_message(self.owner, self.message_id, **values)
        except Exception:  # deleted chat, or the database is gone: report what we know
            log.exception("could not save the end of reply %s", self.message_id)
            return MessageRecord(**{**self._placeholder.__dict__, **values})
