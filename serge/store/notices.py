"""News that a row changed, sent with the change: PostgreSQL's LISTEN/NOTIFY between processes, a call within one.

A Stop or an Allow written by one process must reach the process running that reply at once, not at
its next poll. A store sends a notice in the transaction that writes the row (`send`): on PostgreSQL a
NOTIFY, which every process's listening connection receives when that transaction commits; on SQLite
(one process) the subscribers of this process are called after the commit. The rows stay the truth:
whoever waits still polls them, so a notice lost with a dropped connection only costs a poll's delay.
One listening connection per database, out of the pool, on one thread, for every channel.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from sqlalchemy import event, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

log = logging.getLogger(__name__)

RETRY_S = 2.0  # how long a failed listening connection waits before it connects again


class Notices:
    def __init__(self, engine: Engine, wait_s: float = 0.5) -> None:
        self.engine, self.wait_s = engine, wait_s
        self.between_processes = engine.dialect.name == "postgresql"
        self._subscribers: dict[str, list[Callable[[str], None]]] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def send(self, session: Session, channel: str, payload: str) -> None:
        """Tell `channel`'s subscribers of every process once `session`'s transaction commits."""
        if self.between_processes:
            session.execute(text("SELECT pg_notify(:channel, :payload)"), {"channel": channel, "payload": payload})
        else:
            event.listen(session, "after_commit", lambda _session: self._deliver(channel, payload), once=True)

    def subscribe(self, channel: str, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call `callback(payload)` for each notice on `channel`, from any process; returns the unsubscribe."""
        with self._lock:
            self._subscribers.setdefault(channel, []).append(callback)
            if self.between_processes and self._thread is None and not self._stopping.is_set():
                self._thread = threading.Thread(target=self._listen, name="serge-notices", daemon=True)
                self._thread.start()

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._subscribers.get(channel, []):
                    self._subscribers[channel].remove(callback)
        return unsubscribe

    def close(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(10)

    def _deliver(self, channel: str, payload: str) -> None:
        with self._lock:
            callbacks = list(self._subscribers.get(channel, ()))
        for callback in callbacks:
            try:
                callback(payload)
            except Exception:  # one subscriber's failure is not another's; the poll finds the row anyway
                log.exception("a subscriber of %s failed on %r", channel, payload)

    def _listen(self) -> None:
        while not self._stopping.is_set():
            try:
                self._listen_once()
            except Exception as exc:  # the waiters' polls still find the rows, a little later
                log.warning("listening for notices failed (%s); trying again", exc)
                self._stopping.wait(RETRY_S)

    def _listen_once(self) -> None:
        raw = self.engine.raw_connection()
        connection = raw.driver_connection
        raw.detach()  # LISTEN belongs to this connection: it never goes back to the pool
        listening: set[str] = set()
        try:
            connection.autocommit = True
            while not self._stopping.is_set():
                with self._lock:
                    channels = set(self._subscribers) - listening
                for channel in channels:  # a channel subscribed since: heard from now on
                    connection.execute(f"LISTEN {channel}")
                    listening.add(channel)
                for notice in connection.notifies(timeout=self.wait_s):
                    self._deliver(notice.channel, notice.payload)
        finally:
            raw.close()
