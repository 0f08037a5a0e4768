"""`Usage`: what each user and key spent, and the caps that stop them before a request runs.

A request that runs a model is admitted (`admit`) before it runs and recorded (`record`) with the tokens
its client was told, once it has ended; both go through the database, so every process sharing it
counts the same. Tokens are prompt plus generated tokens (cached ones are part of the prompt's); a day
and a month are UTC's, read from an injected clock. The request that crosses a cap finishes: a cap is
checked against what was spent before the request, never cut mid-reply. A key's cap applies on top of
its user's. Nothing here knows about HTTP or a dialect's error shape.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from serge.store.audit import note
from serge.accounts.service import InvalidAccountInput
from serge.store.usage import QuotaRecord, UsageCount, UsageFilter, UsageStore, UsageTotal

DEFAULT = ("default", "")
MAX_QUOTA = 10**15


class QuotaExceeded(Exception):
    """A cap is reached: the message says which and when it resets; `retry_after_s` is the wait until then."""

    def __init__(self, message: str, retry_after_s: int, quota: str) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.quota = quota


@dataclass(frozen=True)
class UserQuota:
    """A user's caps as they apply (theirs, else the account-wide default's), and their own as set."""

    applied: QuotaRecord
    own: QuotaRecord | None
    default: QuotaRecord


def utc_now() -> datetime:
    return datetime.now(UTC)


def _month_start(day: date) -> date:
    return day.replace(day=1)


def _next_month(day: date) -> date:
    return date(day.year + day.month // 12, day.month % 12 + 1, 1)


def _midnight(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def check_quota(quota: QuotaRecord) -> QuotaRecord:
    for name in ("tokens_per_day", "tokens_per_month", "requests_per_minute"):
        value = getattr(quota, name)
        if value is not None and not 0 <= value <= MAX_QUOTA:
            raise InvalidAccountInput(f"{name} is {value}; give a whole number from 0 to {MAX_QUOTA:,}", name)
    return quota


def _merge(own: QuotaRecord | None, default: QuotaRecord) -> QuotaRecord:
    if own is None:
        return default
    return QuotaRecord(*(getattr(own, f) if getattr(own, f) is not None else getattr(default, f)
                         for f in ("tokens_per_day", "tokens_per_month", "requests_per_minute")))


class Usage:
    def __init__(self, store: UsageStore, clock: Callable[[], datetime] = utc_now) -> None:
        self.store = store
        self.clock = clock

    # --- before and after a request --------------------------------------------------
    def admit(self, user_id: str, key_id: str = "") -> None:
        """Let a model request of this user (and key, "" for none) through and count it, or raise `QuotaExceeded`."""
        now = self.clock().astimezone(UTC)
        minute = int(now.timestamp() // 60)
        checks = [("your", self.user_quota(user_id).applied, None)]
        if key_id and (own := self.store.quota("key", key_id)) is not None:
            checks.append(("this API key's", own, key_id))
        for whose, quota, key in checks:
            self._check(whose, quota, user_id, key, now, minute)
        self.store.count_request(user_id, key_id, minute)

    def _check(self, whose: str, quota: QuotaRecord, user_id: str, key_id: str | None, now: datetime,
               minute: int) -> None:
        today = now.date()
        if quota.requests_per_minute is not None:
            used = self.store.requests_in(user_id, key_id or "", minute)
            if used >= quota.requests_per_minute:
                reset = datetime.fromtimestamp((minute + 1) * 60, UTC)
                self._refuse(f"{whose} quota of {quota.requests_per_minute:,} model requests a minute is used up",
                             reset, now, "requests_per_minute")
        if quota.tokens_per_day is not None:
            used = self.store.tokens_since(user_id, key_id, today)
            if used >= quota.tokens_per_day:
                self._refuse(f"{whose} quota of {quota.tokens_per_day:,} tokens a day is used up ({used:,} used "
                             f"today)", _midnight(today + timedelta(days=1)), now, "tokens_per_day")
        if quota.tokens_per_month is not None:
            used = self.store.tokens_since(user_id, key_id, _month_start(today))
            if used >= quota.tokens_per_month:
                self._refuse(f"{whose} quota of {quota.tokens_per_month:,} tokens a month is used up ({used:,} "
                             f"used this month)", _midnight(_next_month(today)), now, "tokens_per_month")

    @staticmethod
    def _refuse(what: str, reset: datetime, now: datetime, quota: str) -> None:
        wait = max(1, math.ceil((reset - now).total_seconds()))
        raise QuotaExceeded(f"{what}; it resets at {reset:%Y-%m-%d %H:%M} UTC, in {wait} s", wait, quota)

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
        return UserQuota(applied=_merge(own, default), own=own, default=default)

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

    def set_key_quota(self, key_id: str, quota: QuotaRecord) -> None:
        self.store.set_quota("key", key_id, check_quota(quota))
        note(self.store.db, "quota.set", f"key {key_id}: {quota}")
