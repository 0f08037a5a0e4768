"""The usage ledger and the caps: tokens per (UTC day, user, key, model, dialect), and the quotas.

It adds up counts and reads them back; it never sees a message's text, and it decides nothing (which
cap applies, when a day ends: that is `serge.accounts.usage`). Every write is one upsert, so several
processes sharing the database add to the same rows and a cap counted here holds across all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

from sqlalchemy import delete, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from serge.store.db import Database
from serge.store.tables import GroupMember, Quota, UsageDay, UserGroup

GROUPS = ("day", "user", "key", "model", "dialect")
MINUTES_KEPT = 5  # per-minute request counts older than this are cleared as new ones come (serge/store/usage/reservations.py)


@dataclass(frozen=True)
class UsageCount:
    """The tokens one request reported to its client."""

    user_id: str
    key_id: str  # "" for a login session's request
    model: str
    dialect: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class UsageFilter:
    user_id: str | None = None
    key_id: str | None = None
    model: str | None = None
    start: date | None = None  # inclusive
    end: date | None = None  # inclusive


@dataclass(frozen=True)
class UsageTotal:
    """One row of a report: the group's value (a day as YYYY-MM-DD, an id, a model or a dialect) and its sums."""

    group: str
    requests: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class QuotaRecord:
    tokens_per_day: int | None = None
    tokens_per_month: int | None = None
    requests_per_minute: int | None = None

    @property
    def empty(self) -> bool:
        return self.tokens_per_day is None and self.tokens_per_month is None and self.requests_per_minute is None


def ledger_add(insert, day: date, count: UsageCount):
    """The upsert that adds one finished request to its day's row (made on the first); `insert`: the dialect's."""
    values = {"day": day, "user_id": count.user_id, "key_id": count.key_id, "model": count.model[:200],
              "dialect": count.dialect, "requests": 1, "prompt_tokens": count.prompt_tokens,
              "cached_tokens": count.cached_tokens, "completion_tokens": count.completion_tokens}
    statement = insert(UsageDay).values(**values)
    excluded = statement.excluded
    return statement.on_conflict_do_update(
        index_elements=["day", "user_id", "key_id", "model", "dialect"],
        set_={name: getattr(UsageDay, name) + getattr(excluded, name)
              for name in ("requests", "prompt_tokens", "cached_tokens", "completion_tokens")})


class UsageStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def _insert(self):
        return pg_insert if self.db.engine.dialect.name == "postgresql" else sqlite_insert

    # --- the ledger -------------------------------------------------------------
    def add(self, day: date, count: UsageCount) -> None:
        """Add one finished request to its day's row (made on the first)."""
        with self.db.session() as session, session.begin():
            session.execute(ledger_add(self._insert(), day, count))

    def tokens_since(self, user_id: str, key_id: str | None, first_day: date) -> int:
        """Prompt and generated tokens of a user (of one key of theirs, given `key_id`) from `first_day` on."""
        query = select(func.coalesce(func.sum(UsageDay.prompt_tokens + UsageDay.completion_tokens), 0)).where(
            UsageDay.user_id == user_id, UsageDay.day >= first_day)
        if key_id is not None:
            query = query.where(UsageDay.key_id == key_id)
        with self.db.session() as session:
            return int(session.scalar(query))

    def totals(self, by: str, only: UsageFilter) -> list[UsageTotal]:
        """Sums grouped `by` one of GROUPS, over the rows `only` lets through (days ascending, else most used first)."""
        column = {"day": UsageDay.day, "user": UsageDay.user_id, "key": UsageDay.key_id, "model": UsageDay.model,
                  "dialect": UsageDay.dialect}[by]
        sums = [func.sum(getattr(UsageDay, name)) for name in
                ("requests", "prompt_tokens", "cached_tokens", "completion_tokens")]
        query = select(column, *sums).group_by(column)
        for field, value in (("user_id", only.user_id), ("key_id", only.key_id), ("model", only.model)):
            if value is not None:
                query = query.where(getattr(UsageDay, field) == value)
        if only.start is not None:
            query = query.where(UsageDay.day >= only.start)
        if only.end is not None:
            query = query.where(UsageDay.day <= only.end)
        query = query.order_by(column if by == "day" else (sums[1] + sums[3]).desc(), column)
        with self.db.session() as session:
            return [UsageTotal(group=str(value), requests=int(r), prompt_tokens=int(p), cached_tokens=int(c),
                               completion_tokens=int(g)) for value, r, p, c, g in session.execute(query)]

    # --- quotas -------------------------------------------------------------------
    def quota(self, kind: str, subject: str) -> QuotaRecord | None:
        with self.db.session() as session:
            row = session.get(Quota, (kind, subject))
            return None if row is None else QuotaRecord(row.tokens_per_day, row.tokens_per_month,
                                                        row.requests_per_minute)

    def quotas(self, kind: str) -> dict[str, QuotaRecord]:
        with self.db.session() as session:
            return {row.subject: QuotaRecord(row.tokens_per_day, row.tokens_per_month, row.requests_per_minute)
                    for row in session.scalars(select(Quota).where(Quota.kind == kind))}

    def group_quotas_of(self, user_id: str) -> list[tuple[str, QuotaRecord]]:
        """(group name, caps) of each group of the user that has caps, by name."""
        query = (select(UserGroup.name, Quota).join(Quota, (Quota.kind == "group") & (Quota.subject == UserGroup.id))
                 .join(GroupMember, GroupMember.group_id == UserGroup.id).where(GroupMember.user_id == user_id)
                 .order_by(UserGroup.name))
        with self.db.session() as session:
            return [(name, QuotaRecord(row.tokens_per_day, row.tokens_per_month, row.requests_per_minute))
                    for name, row in session.execute(query)]

    def set_quota(self, kind: str, subject: str, quota: QuotaRecord) -> None:
        """Replace a cap; an empty one is removed (the default applies again)."""
        with self.db.session() as session, session.begin():
            session.execute(delete(Quota).where(Quota.kind == kind, Quota.subject == subject))
            if not quota.empty:
                session.add(Quota(kind=kind, subject=subject, tokens_per_day=quota.tokens_per_day,
                                  tokens_per_month=quota.tokens_per_month,
                                  requests_per_minute=quota.requests_per_minute))
