"""What one user has spent against their own caps, today and this month, and in plain words.

For the "My usage" page and `GET /api/usage/mine`: tokens and requests of the UTC day and month so far,
the caps that apply (theirs, else their groups' most generous, else the account-wide default's, field by
field) and where each comes from, when each count starts again, and a
sentence for each a person reads without a glossary. `in_words` writes a wait the way a person says it
(`waits.in_words`). Who may read whose usage is the caller's to decide; nothing here knows about HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from serge.accounts.usage import Usage, month_start, next_month, utc_midnight
from serge.accounts.waits import in_words
from serge.store import QuotaRecord, UsageFilter


class Spent(NamedTuple):
    """What one period (today, this month) took, as its caps count it."""

    tokens: int
    requests: int


@dataclass(frozen=True)
class MyUsage:
    """A person's own use against their caps, for the page and `/api/usage/mine`."""

    today: Spent
    month: Spent
    caps: QuotaRecord  # as they apply (`serge.accounts.usage`'s rule); None in a field: no cap
    day_resets: datetime  # UTC midnight
    month_resets: datetime  # the first of next month, UTC
    now: datetime
    sources: dict[str, str | None] = field(default_factory=dict)  # field -> "own", "group:NAME", "default", None

    def source_words(self, name: str) -> str:
        """Where the cap `name` comes from, in words: "" for no cap."""
        source = self.sources.get(name)
        if source == "own":
            return "your own quota"
        if source and source.startswith("group:"):
            return f"the quota of your group {source[6:]}"
        return "the default quota" if source == "default" else ""

    def sentences(self) -> list[str]:
        """Each count against its cap, as a person would say it."""
        day_wait, month_wait = in_words((self.day_resets - self.now).total_seconds()), \
            in_words((self.month_resets - self.now).total_seconds())
        said = [_against("today", self.today, self.caps.tokens_per_day, f"midnight UTC, in {day_wait}"),
                _against("this month", self.month, self.caps.tokens_per_month,
                         f"{self.month_resets:%B} 1st (UTC), in {month_wait}"),
                (f"You may send up to {self.caps.requests_per_minute:,} model requests a minute."
                 if self.caps.requests_per_minute is not None else "You have no cap on requests a minute.")]
        whence = [f"{what} comes from {self.source_words(name)}" for name, what in
                  (("tokens_per_day", "Your cap a day"), ("tokens_per_month", "your cap a month"),
                   ("requests_per_minute", "your cap on requests a minute")) if self.source_words(name)]
        if whence:
            said.append("; ".join(whence)[0].upper() + "; ".join(whence)[1:] + ".")
        return said


def _against(when: str, spent: Spent, cap: int | None, resets: str) -> str:
    requests = f"{spent.requests:,} request{'' if spent.requests == 1 else 's'}"
    if cap is None:
        return f"You have used {spent.tokens:,} tokens in {requests} {when}, with no cap."
    left = max(0, cap - spent.tokens)
    share = min(100, round(100 * spent.tokens / cap)) if cap else 100
    return (f"You have used {spent.tokens:,} of your {cap:,} tokens {when} ({share}%) in {requests}; "
            f"{left:,} are left, and the count starts again at {resets}.")


def my_usage(usage: Usage, user_id: str, capped: bool = True) -> MyUsage:
    """`user_id`'s spending this UTC day and month, and the caps that apply to them (none when not `capped`:
    the requests made while Serge has no accounts, which no cap stops)."""
    now = usage.clock().astimezone(UTC)
    today = now.date()
    quota = usage.user_quota(user_id) if capped else None
    caps = quota.applied if quota is not None else QuotaRecord()

    def spent(start) -> Spent:
        rows = usage.totals("user", UsageFilter(user_id=user_id, start=start, end=today))
        return Spent(sum(r.prompt_tokens + r.completion_tokens for r in rows), sum(r.requests for r in rows))

    return MyUsage(spent(today), spent(month_start(today)), caps, utc_midnight(today + timedelta(days=1)),
                   utc_midnight(next_month(today)), now, quota.sources if quota is not None else {})
