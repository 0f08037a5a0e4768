"""`Usage`: what each user and key spent, and the caps that stop them before a request runs.

The ledger (`record`, `totals`) and the caps as they apply, field by field (tokens a day, tokens a month,
requests a minute): a user's own cap, where set, wins; else the most generous cap their groups' quotas set
(a group's quota that leaves a field out says nothing of it); else the account-wide default's; else none.
A key's caps apply on top of its user's. A model request is admitted and its budget held against the caps by
`serge.accounts.reservations`, which settles it into this ledger when it ends; everything goes through
the database, so every process sharing it counts the same. Tokens are prompt plus generated tokens
(cached ones are part of the prompt's); a day and a month are UTC's, read from an injected clock.
Nothing here knows about HTTP or a dialect's error shape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime

from serge.store.people.audit import note
from serge.accounts.service import InvalidAccountInput
from serge.store.usage.ledger import QuotaRecord, UsageCount, UsageFilter, UsageStore, UsageTotal

DEFAULT = ("default", "")
MAX_QUOTA = 10**15


class QuotaExceeded(Exception):
    """A cap is reached: the message says which and when it resets; `retry_after_s` is the wait until then."""

    def __init__(self, message: str, retry_after_s: int, quota: str) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.quota = quota


FIELDS = ("tokens_per_day", "tokens_per_month", "requests_per_minute")


@dataclass(frozen=True)
class UserQuota:
    """A user's caps as they apply (field by field: theirs, else their groups' most generous, else the
    account-wide default's), their own as set, and where each applied cap comes from."""

    applied: QuotaRecord
    own: QuotaRecord | None
    default: QuotaRecord
    # field -> "own", "group:NAME", "default", or None (no cap of that kind)
    sources: dict[str, str | None] = field(default_factory=lambda: dict.fromkeys(FIELDS))

    def whose(self, name: str) -> str:
        """Whose cap `name` is, as a refusal says it: "your" or "the group NAME's"."""
        source = self.sources.get(name) or ""
        return f"the group {source[6:]}'s" if source.startswith("group:") else "your"


def utc_now() -> datetime:
    return datetime.now(UTC)


def month_start(day: date) -> date:
    return day.replace(day=1)


def next_month(day: date) -> date:
    return date(day.year + day.month // 12, day.month % 12 + 1, 1)


def utc_midnight(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def check_quota(quota: QuotaRecord) -> QuotaRecord:
    for name in ("tokens_per_day", "tokens_per_month", "requests_per_minute"):
        value = getattr(quota, name)
        if value is not None and not 0 <= value <= MAX_QUOTA:
            raise InvalidAccountInput(f"{name} is {value}; give a whole number from 0 to {MAX_QUOTA:,}", name)
    return quota


def applied_caps(own: QuotaRecord | None, groups: list[tuple[str, QuotaRecord]],
                 default: QuotaRecord) -> tuple[QuotaRecord, dict[str, str | None]]:
    """The caps that apply, field by field, and where each comes from: the user's own, where set; else the
    largest of those their groups' quotas set (the first group by name on a tie); else the default's."""
    values: dict[str, int | None] = {}
    sources: dict[str, str | None] = {}
    for name in FIELDS:
        set_by_groups = sorted((-getattr(q, name), group) for group, q in groups if getattr(q, name) is not None)
        if own is not None and getattr(own, name) is not None:
            values[name], sources[name] = getattr(own, name), "own"
        elif set_by_groups:
            values[name], sources[name] = -set_by_groups[0][0], f"group:{set_by_groups[0][1]}"
        elif getattr(default, name) is not None:
            values[name], sources[name] = getattr(default, name), "default"
        else:
            values[name], sources[name] = None, None
    return QuotaRecord(**values), sources


class Usage:
    def __init__(self, store: UsageStore, clock: Callable[[], datetime] = utc_now) -> None:
        self.store = store
        self.clock = clock

    # --- after a request (`serge.accounts.reservations` admits it and holds its budget) -------------
    def record(self, count: UsageCount) -> None:
        """Add a finished request's tokens to today's (UTC) row of its user, key, model and dialect."""
        self.store.add(self.clock().astimezone(UTC).date(), count)

    def totals(self, by: str, only: UsageFilter) -> list[UsageTotal]:
        return self.store.totals(by, only)

    # --- the caps ----------------------------------------------------------------------
    def default_quota(self) -> QuotaRecord:
        return self.store.quota(*DEFAULT) or QuotaRecord()

    def user_quota(self, user_id: str) -> UserQuota:
        default = self.default_quota()
        own = self.store.quota("user", user_id)
        applied, sources = applied_caps(own, self.store.group_quotas_of(user_id), default)
        return UserQuota(applied=applied, own=own, default=default, sources=sources)

    def user_quotas(self) -> dict[str, QuotaRecord]:
        """Every user's own caps, by user id (users without any are absent: the default applies)."""
        return self.store.quotas("user")

    def key_quota(self, key_id: str) -> QuotaRecord | None:
        return self.store.quota("key", key_id)

    def set_default_quota(self, quota: QuotaRecord) -> None:
        self.store.set_quota(*DEFAULT, check_quota(quota))
        note(self.store.db, "quota.set", f"default: {quota}")

    def set_user_quota(self, user_id: str, quota: QuotaRecord) -> None:
        """A user's own caps (an empty one: the default applies again)."""
        self.store.set_quota("user", user_id, check_quota(quota))
        note(self.store.db, "quota.set", f"user {user_id}: {quota}")

    def group_quota(self, group_id: str) -> QuotaRecord | None:
        return self.store.quota("group", group_id)

    def set_group_quota(self, group_id: str, group_name: str, quota: QuotaRecord) -> None:
        """A group's caps (an empty one: none); they apply to its members without caps of their own."""
        self.store.set_quota("group", group_id, check_quota(quota))
        note(self.store.db, "quota.set", f"group {group_name}: {quota}")

    def set_key_quota(self, key_id: str, quota: QuotaRecord) -> None:
        self.store.set_quota("key", key_id, check_quota(quota))
        note(self.store.db, "quota.set", f"key {key_id}: {quota}")
