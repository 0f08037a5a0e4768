"""The SQL of replies in progress and open streams, for several Serge processes sharing one database.

`RunningStore` is one process's view: it claims a chat's reply (a row keyed by the chat, so a second
claim from any process fails), asks the owning process to stop one, renews its own rows' heartbeat
and clears other processes' rows whose heartbeat is older than the lease (a process that died), marking
their replies interrupted. It counts a user's open streams under a lock on the user's row, so two
processes cannot both take the last one. A stop request is also sent as a notice on `STOP_CHANNEL`
(serge/store/notices.py); the owner finds it by polling `stops()` too, should the notice be lost.
What the rows mean for a reply, and when to poll, is the chat service's business (serge/chats/replies/running.py).
Times are the processes' own clocks (UTC): processes on several machines need their clocks in sync.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import IntegrityError

from serge.store.db import Database
from serge.store.tables import Message, RunningReply, User, UserStream, now

STOP_CHANNEL = "serge_stop"


@dataclass(frozen=True)
class RunningRecord:
    chat_id: str
    owner: str
    message_id: str | None
    process: str
    stop_requested: bool
    started_at: datetime
    heartbeat_at: datetime

    @classmethod
    def of(cls, row: RunningReply) -> RunningRecord:
        return cls(row.chat_id, row.owner, row.message_id, row.process, row.stop_requested, row.started_at,
                   row.heartbeat_at)


class RunningStore:
    def __init__(self, db: Database, process: str, lease_s: float) -> None:
        self.db, self.process, self.lease = db, process, timedelta(seconds=lease_s)

    def _fresh(self):
        return RunningReply.heartbeat_at >= now() - self.lease

    # --- replies ---------------------------------------------------------------------
    def claim(self, chat_id: str, owner: str) -> bool:
        """Mark the chat's reply as running in this process; False when a live process runs one already."""
        with self.db.session() as session, session.begin():
            stale = session.get(RunningReply, chat_id)
            if stale is not None and stale.heartbeat_at < now() - self.lease:
                self._interrupt(session, [stale], now() - self.lease)
        try:
            with self.db.session() as session, session.begin():
                stamp = now()
                session.add(RunningReply(chat_id=chat_id, owner=owner, process=self.process, stop_requested=False,
                                         started_at=stamp, heartbeat_at=stamp))
        except IntegrityError:
            return False
        return True

    def started(self, chat_id: str, message_id: str) -> bool:
        """Name the message the claimed reply writes; True when a stop was asked for before it had one."""
        with self.db.session() as session, session.begin():
            row = session.get(RunningReply, chat_id)
            if row is None or row.process != self.process:
                return False
            row.message_id = message_id
            return row.stop_requested

    def release(self, chat_id: str) -> None:
        with self.db.session() as session, session.begin():
            session.execute(delete(RunningReply).where(RunningReply.chat_id == chat_id,
                                                       RunningReply.process == self.process))

    def find(self, chat_id: str) -> RunningRecord | None:
        """The chat's reply running in a live process, if any."""
        with self.db.session() as session:
            row = session.scalars(select(RunningReply).where(RunningReply.chat_id == chat_id, self._fresh())).first()
            return RunningRecord.of(row) if row else None

    def running_chats(self) -> set[str]:
        """The chats whose reply a live process runs."""
        with self.db.session() as session:
            return set(session.scalars(select(RunningReply.chat_id).where(self._fresh())))

    def request_stop(self, chat_id: str) -> RunningRecord | None:
        """Ask the process running the chat's reply to stop it (a NOTIFY too, on PostgreSQL); None when none runs."""
        with self.db.session() as session, session.begin():
            row = session.scalars(select(RunningReply).where(RunningReply.chat_id == chat_id, self._fresh())
                                  .with_for_update()).first()
            if row is None:
                return None
            row.stop_requested = True
            self.db.notices.send(session, STOP_CHANNEL, chat_id)
            return RunningRecord.of(row)

    def stops(self) -> list[str]:
        """The chats whose reply this process runs and someone asked to stop."""
        with self.db.session() as session:
            return list(session.scalars(select(RunningReply.chat_id).where(
                RunningReply.process == self.process, RunningReply.stop_requested.is_(True))))

    # --- streams -----------------------------------------------------------------------
    def open_stream(self, user_id: str, limit: int) -> str | None:
        """Count a stream of the user, under a lock on their row; None (nothing counted) at the limit."""
        with self.db.session() as session, session.begin():
            session.execute(select(User.id).where(User.id == user_id).with_for_update())
            open_now = session.scalar(select(func.count()).select_from(UserStream).where(
                UserStream.user_id == user_id, UserStream.heartbeat_at >= now() - self.lease))
            if open_now >= limit:
                return None
            stream_id = uuid.uuid4().hex
            session.add(UserStream(id=stream_id, user_id=user_id, process=self.process, heartbeat_at=now()))
            return stream_id

    def close_stream(self, stream_id: str) -> None:
        with self.db.session() as session, session.begin():
            session.execute(delete(UserStream).where(UserStream.id == stream_id))

    # --- the heartbeat -------------------------------------------------------------------
    def beat(self) -> int:
        """Renew this process's rows; clear dead processes' (their replies marked interrupted). How many cleared."""
        stamp = now()
        with self.db.session() as session, session.begin():
            session.execute(update(RunningReply).where(RunningReply.process == self.process)
                            .values(heartbeat_at=stamp))
            session.execute(update(UserStream).where(UserStream.process == self.process).values(heartbeat_at=stamp))
            dead = list(session.scalars(select(RunningReply).where(RunningReply.heartbeat_at < stamp - self.lease)
                                        .with_for_update(skip_locked=True)))
            self._interrupt(session, dead, stamp - self.lease)
            gone = session.execute(delete(UserStream).where(UserStream.heartbeat_at < stamp - self.lease))
            return len(dead) + (gone.rowcount or 0)

    def forget_mine(self) -> None:
        """At the end of this process: none of its rows outlives it."""
        with self.db.session() as session, session.begin():
            session.execute(delete(RunningReply).where(RunningReply.process == self.process))
            session.execute(delete(UserStream).where(UserStream.process == self.process))

    @staticmethod
    def _interrupt(session, rows: list[RunningReply], cutoff: datetime) -> None:
        """A dead process's replies: their text so far stays, marked interrupted, and the chats are free (a row
        another process cleared first, or whose owner came back to life, is left)."""
        ids = [r.message_id for r in rows if r.message_id]
        if ids:
            session.execute(update(Message).where(Message.id.in_(ids), Message.complete.is_(False),
                                                  Message.finish_reason.is_(None))
                            .values(finish_reason="interrupted"))
        if rows:
            session.execute(delete(RunningReply).where(RunningReply.chat_id.in_([r.chat_id for r in rows]),
                                                       RunningReply.heartbeat_at < cutoff))
