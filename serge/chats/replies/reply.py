"""One assistant reply being generated: read from the engine, saved as it grows.

A `Reply` owns a thread that reads the engine's `Stream` to the end, whoever is
listening: the text is written to the database about once a second, and the
final text, token counts, timings and finish reason when the stream ends (a
thinking model's thoughts are saved beside the text, the same way). So a
page that closes, a `/stop`, or an engine error all leave a saved (incomplete)
reply, and a server killed mid-reply leaves at most a second of text unsaved.
When the database refuses a write (locked by another program, a full disk), the
text stays in memory and generation goes on; if the end cannot be saved, the
listeners are told so (an `error` reply), and a thread keeps trying to save it
for a while, so a fault that clears loses nothing.

Listeners read through `events()`, on their own event loop: the reply's thread
(for text and the end) and the stream (for a new place in the queue) wake that
loop directly, as the OpenAI stream is woken. No thread waits per listener and
nothing polls, so sixteen pages cost the server what sixteen API streams do.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from functools import partial

from serge.engine import FinishReason, GenerationRecord, Stream
from serge.store import MESSAGE_FIELDS, ChatStore, DatabaseUnavailable, MessageRecord

log = logging.getLogger(__name__)

FLUSH_EVERY_S = 1.0
SAVE_RETRY_EVERY_S = 2.0  # while the database refuses the end of a reply
SAVE_RETRY_FOR_S = 600.0  # then the next start marks it interrupted
COMPLETE = {FinishReason.STOP, FinishReason.LENGTH}


class _Leaving:
    """A reply as its page's leaving sees it: stopped, unless a tool call of it waits for the person's Allow or
    Deny, which a reload of the page or another tab still gives."""

    def __init__(self, stream) -> None:
        self.stream = stream

    @property
    def done(self) -> bool:
        return self.stream.done

    def cancel(self) -> None:
        if not getattr(self.stream, "waiting", False):
            self.stream.cancel()


class Reply:
    def __init__(self, store: ChatStore, owner: str, chat_id: str, message: MessageRecord,
                 user_message: MessageRecord | None, stream: Stream,
                 on_done: Callable[[Reply], None], dropped_messages: int = 0,
                 sources: list[dict] | None = None) -> None:
        self.owner, self.chat_id = owner, chat_id
        self.message_id = message.id
        self.model = message.model
        self.user_message = user_message
        self.stream = stream
        # Messages of the chat, oldest first, that the model did not see for this reply.
        self.dropped_messages = dropped_messages
        self.sources = sources  # the passages of documents the model was given, kept with the reply
        self._store = store
        self._on_done = on_done
        # the reply so far, as ("delta", text) and ("reasoning", thought) in order; only the reply's thread appends
        self._parts: list[tuple[str, str]] = []
        self._final: MessageRecord | None = None
        self._over = False  # saved for good and released by the chat: listeners may end
        self._listeners: list[Callable[[], None]] = []
        self._lock = threading.Lock()
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

    def leaving(self) -> _Leaving:
        """What the page that started the reply stops when it goes away (`cancel`, as a stream's reader would)."""
        return _Leaving(self.stream)

    def wait(self, timeout: float = 60.0) -> MessageRecord | None:
        """Block until the reply is saved for good; returns the saved message."""
        self._thread.join(timeout)
        return self._final

    async def events(self) -> AsyncIterator[tuple[str, object]]:
        """("queued", requests ahead) while it waits for a slot, ("delta", text) for each piece
        of the reply and ("reasoning", thought) for each piece of a thinking model's thoughts
        (from the first, however late the listener comes), then ("done", the saved MessageRecord)."""
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        wake = partial(loop.call_soon_threadsafe, ready.set)
        with self._lock:
            self._listeners.append(wake)
        unwatch = self.stream.watch(wake)  # only for its place in the queue: text comes from our thread
        told, sent = None, 0
        try:
            while True:
                ready.clear()  # whatever happens from here on sets it again
                over = self._over
                position = self.stream.queue_position
                if position is None:
                    unwatch()
                elif position != told and not sent:
                    told = position
                    yield "queued", position
                while sent < len(self._parts):
                    sent += 1
                    yield self._parts[sent - 1]
                if over:  # every part was in before `_over` was set
                    yield "done", self._final
                    return
                await ready.wait()
        finally:
            unwatch()
            with self._lock:
                self._listeners.remove(wake)

    def _tell_listeners(self) -> None:
        with self._lock:
            listeners = tuple(self._listeners)
        for wake in listeners:
            try:
                wake()
            except RuntimeError:  # that listener's event loop has closed
                pass

    # --- the reply's own thread -------------------------------------------------
    def _run(self) -> None:
        parts = self._parts
        flushed = time.monotonic()
        try:
            for delta in self.stream.deltas():
                if delta.reasoning:
                    parts.append(("reasoning", delta.reasoning))
                if delta.text:
                    parts.append(("delta", delta.text))
                tool = getattr(delta, "tool", None)  # a call the reply made (serge.chats.tools), as it goes
                if tool:
                    parts.append(("tool", tool))
                if not (delta.text or delta.reasoning or tool):
                    continue
                self._tell_listeners()
                if time.monotonic() - flushed >= FLUSH_EVERY_S:
                    flushed = time.monotonic()
                    try:
                        self._store.save_text(self.owner, self.message_id, *self._so_far())
                    except DatabaseUnavailable as exc:  # kept in memory; the next flush or the end saves it
                        log.warning("reply %s: could not save its text so far: %s", self.message_id, exc.reason)
        except Exception:
            log.exception("reply %s failed", self.message_id)
            self.stream.cancel()
        finally:
            try:
                record = self.stream.close()
            except Exception as exc:
                record = None
                log.error("reply %s: %s", self.message_id, exc)
            self._final = self._save(record, *self._so_far())
            try:
                self._on_done(self)
            finally:
                self._over = True
                self._tell_listeners()

    def _so_far(self) -> tuple[str, str | None]:
        """The reply's text and its thoughts (None when it has none), as streamed so far."""
        parts = tuple(self._parts)
        thought = "".join(value for kind, value in parts if kind == "reasoning")
        return "".join(value for kind, value in parts if kind == "delta"), thought or None

    def _save(self, record: GenerationRecord | None, text: str, thought: str | None) -> MessageRecord:
        if record is None:
            values = dict(content=text, reasoning=thought, finish_reason="error", complete=False,
                          error="the model worker did not stop in time")
        else:
            stats = {k: getattr(record, k) for k in MESSAGE_FIELDS if hasattr(record, k)}  # the same names
            values = {**stats, "content": record.text or text, "reasoning": record.reasoning or thought,
                      "reasoning_tokens": record.reasoning_tokens or None, "seed": str(record.seed),
                      "finish_reason": record.finish_reason.value, "complete": record.finish_reason in COMPLETE,
                      "dropped_messages": self.dropped_messages, "sources": self.sources}
        values["tool_calls"] = list(getattr(self.stream, "tool_log", None) or ()) or None
        try:
            return self._store.finish_message(self.owner, self.message_id, **values)
        except DatabaseUnavailable as exc:  # tell the listeners, and keep trying behind them
            log.error("reply %s: could not save its end: %s; retrying", self.message_id, exc.reason)
            threading.Thread(target=self._retry_save, args=(values,), name=f"serge-save-{self.chat_id[:8]}",
                             daemon=True).start()
            values = {**values, "finish_reason": "error", "complete": False,
                      "error": f"the reply could not be saved: {exc.reason}; Serge keeps trying, and it appears "
                               f"in the chat once saved"}
        except Exception:  # the chat was deleted while the reply streamed: report what we know
            log.exception("could not save the end of reply %s", self.message_id)
        return MessageRecord(**{**self._placeholder.__dict__, **values})

    def _retry_save(self, values: dict) -> None:
        deadline = time.monotonic() + SAVE_RETRY_FOR_S
        while time.monotonic() < deadline:
            time.sleep(SAVE_RETRY_EVERY_S)
            try:
                self._store.finish_message(self.owner, self.message_id, **values)
            except DatabaseUnavailable:
                continue
            except Exception:
                log.exception("could not save the end of reply %s", self.message_id)
                return
            log.info("reply %s: saved after the database came back", self.message_id)
            return
        log.error("reply %s: gave up saving its end; the next start marks it interrupted", self.message_id)
