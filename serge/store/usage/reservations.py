"""The SQL of usage reservations: a model request's budget, held against its user's caps until it settles.

`ReservationStore` is one process's view. `open` and `grow` run the caller's check of the caps and the
write it allows in one transaction that first takes a lock on the user's row (PostgreSQL: `SELECT ...
FOR UPDATE`; SQLite: an UPDATE as the first statement, so the transaction holds the one writer's lock
before it reads), so two requests of one user, in any process, are counted one after the other and
never both pass a cap that one of them reaches. `settle` removes a request's row and adds its real
usage to the ledger in one transaction; a row already gone (settled by another process as a dead
one's) adds nothing. `beat` renews the rows of this process's requests still running and settles
rows whose heartbeat is older than the lease at their reserved amount, so tokens a client was streamed
by a process that died are still counted (and a row whose settling failed is not held for ever).
Which caps apply, and what a refusal says, is `serge.accounts.reservations`'s.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import date, timedelta

from sqlalchemy import delete, func, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from serge.store.db import Database
from serge.store.tables import UsageDay, UsageMinute, UsageReservation, User, now
from serge.store.usage.ledger import MINUTES_KEPT, UsageCount, ledger_add


@dataclass(frozen=True)
class Spent:
    """What a user (or one of their keys) has spent, as a cap counts it: settled tokens plus those reserved."""

    requests_this_minute: int
    tokens_today: int
    tokens_this_month: int
    reserved: int  # of the tokens, those reserved by requests still running


@dataclass(frozen=True)
class Period:
    """Where the counts start: the clock minute (since the epoch), today and the month's first day (UTC)."""

    minute: int
    day: date
    month: date


# Reads what the user (key_id None) or one of their keys has spent; the check raises to refuse.
Read = Callable[[str | None], Spent]
Check = Callable[[Read], None]


class ReservationStore:
    def __init__(self, db: Database, process: str, lease_s: float) -> None:
        self.db, self.process, self.lease = db, process, timedelta(seconds=lease_s)

    def _insert(self):
        return pg_insert if self.db.engine.dialect.name == "postgresql" else sqlite_insert

    def _lock_user(self, session, user_id: str) -> None:
        """Hold the user's row to the end of the transaction: their checks and writes queue up behind it."""
        if self.db.engine.dialect.name == "sqlite":  # the first statement writes: the one writer's lock, then read
            session.execute(text("UPDATE users SET id = id WHERE id = :id"), {"id": user_id})
        else:
            session.execute(select(User.id).where(User.id == user_id).with_for_update())

    @staticmethod
    def _spent(session, user_id: str, key_id: str | None, period: Period) -> Spent:
        def ledger(first_day: date) -> int:
            query = select(func.coalesce(func.sum(UsageDay.prompt_tokens + UsageDay.completion_tokens), 0)).where(
                UsageDay.user_id == user_id, UsageDay.day >= first_day)
            return int(session.scalar(query if key_id is None else query.where(UsageDay.key_id == key_id)))

        held = select(func.coalesce(func.sum(UsageReservation.prompt_tokens + UsageReservation.completion_tokens),
                                    0)).where(UsageReservation.user_id == user_id)
        reserved = int(session.scalar(held if key_id is None else held.where(UsageReservation.key_id == key_id)))
        requests = session.scalar(select(UsageMinute.requests).where(
            UsageMinute.user_id == user_id, UsageMinute.key_id == (key_id or ""), UsageMinute.minute == period.minute))
        return Spent(requests or 0, ledger(period.day) + reserved, ledger(period.month) + reserved, reserved)

    # --- a request's life ------------------------------------------------------------------
    def open(self, user_id: str, key_id: str, dialect: str, period: Period, check: Check) -> str:
        """Admit a model request: `check` the caps on what is spent, then count the request in its minute and
        hold a reservation of no tokens yet, all in one transaction under the user's lock. Its id."""
        insert = self._insert()
        with self.db.session() as session, session.begin():
            self._lock_user(session, user_id)
            check(lambda key: self._spent(session, user_id, key, period))
            session.execute(delete(UsageMinute).where(UsageMinute.user_id == user_id,  # only rows this lock holds
                                                      UsageMinute.minute < period.minute - MINUTES_KEPT))
            for key in ("", key_id) if key_id else ("",):
                statement = insert(UsageMinute).values(user_id=user_id, key_id=key, minute=period.minute, requests=1)
                session.execute(statement.on_conflict_do_update(
                    index_elements=["user_id", "key_id", "minute"], set_={"requests": UsageMinute.requests + 1}))
            reservation = uuid.uuid4().hex
            session.add(UsageReservation(id=reservation, user_id=user_id, key_id=key_id, model="-", dialect=dialect,
                                         prompt_tokens=0, completion_tokens=0, process=self.process,
                                         heartbeat_at=now()))
            return reservation

    def grow(self, reservation: str, user_id: str, model: str, prompt_tokens: int, completion_tokens: int,
             period: Period, check: Check | None) -> None:
        """Add a budget to a request's reservation, after `check` (None: none) under the user's lock."""
        with self.db.session() as session, session.begin():
            self._lock_user(session, user_id)
            if check is not None:
                check(lambda key: self._spent(session, user_id, key, period))
            session.execute(update(UsageReservation).where(UsageReservation.id == reservation).values(
                model=model[:200], prompt_tokens=UsageReservation.prompt_tokens + prompt_tokens,
                completion_tokens=UsageReservation.completion_tokens + completion_tokens, heartbeat_at=now()))

    def settle(self, reservation: str, day: date, counts: list[UsageCount]) -> bool:
        """Remove the reservation and add the request's real usage to `day`'s ledger, in one transaction; False
        (nothing added) when it was settled already."""
        insert = self._insert()
        with self.db.session() as session, session.begin():
            gone = session.execute(delete(UsageReservation).where(UsageReservation.id == reservation))
            if not gone.rowcount:
                return False
            for count in counts:
                session.execute(ledger_add(insert, day, count))
            return True

    # --- the heartbeat ---------------------------------------------------------------------
    def beat(self, day: date, running: Collection[str]) -> int:
        """Renew the reservations of this process's requests still `running`; settle those no process renewed
        for the lease at what they reserved, on `day` (one that reserved no tokens ran no model: it is only
        removed). How many settled."""
        insert = self._insert()
        cutoff = now() - self.lease
        with self.db.session() as session, session.begin():
            session.execute(update(UsageReservation).where(UsageReservation.process == self.process,
                                                           UsageReservation.id.in_(list(running)))
                            .values(heartbeat_at=now()))  # first a write (SQLite's lock)
            dead = list(session.scalars(select(UsageReservation).where(UsageReservation.heartbeat_at < cutoff)
                                        .with_for_update(skip_locked=True)))
            settled = 0
            for row in dead:
                gone = session.execute(delete(UsageReservation).where(UsageReservation.id == row.id,
                                                                      UsageReservation.heartbeat_at < cutoff))
                if gone.rowcount and row.prompt_tokens + row.completion_tokens:
                    session.execute(ledger_add(insert, day, UsageCount(
                        row.user_id, row.key_id, row.model, row.dialect, row.prompt_tokens, 0,
                        row.completion_tokens)))
                    settled += 1
            return settled
