"""Usage reports with names: the ledger's totals with each user and key named, for the API, the page and the CLI.

The ledger keeps ids (a user or key may be renamed or removed; what they used stays); this names
them for a reader: a user by name, a key by its visible prefix and name. Who may read whose usage is
decided by the caller (the web's route, the CLI on the server's machine), not here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

from serge.accounts.service import Accounts, InvalidAccountInput
from serge.accounts.usage import Usage
from serge.store import UsageFilter

BY = ("day", "user", "key", "model", "dialect")
MAX_DAYS = 3660  # a report covers at most ten years


@dataclass(frozen=True)
class UsageRow:
    group: str  # the day (YYYY-MM-DD), the user's or key's id, the model or the dialect
    label: str  # the same for a reader: a user's name, a key's prefix and name ("" for a login's requests)
    requests: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def usage_filter(accounts: Accounts, *, user: str | None = None, key: str | None = None, model: str | None = None,
                 start: date | None = None, end: date | None = None) -> UsageFilter:
    """A filter from what a reader names (a user by name, a key by id), checked."""
    if start and end and start > end:
        raise InvalidAccountInput(f"from ({start}) is after to ({end})", "from")
    if start and end and (end - start).days > MAX_DAYS:
        raise InvalidAccountInput(f"a report covers at most {MAX_DAYS} days", "from")
    user_id = accounts.user(user).id if user else None
    return UsageFilter(user_id=user_id, key_id=key or None, model=model or None, start=start, end=end)


def usage_rows(usage: Usage, accounts: Accounts, by: str, only: UsageFilter) -> list[UsageRow]:
    if by not in BY:
        raise InvalidAccountInput(f"by is one of {', '.join(BY)}; not {by!r}", "by")
    names: dict[str, str] = {}
    if by in ("user", "key"):
        users = accounts.users()
        names = {u.id: u.name for u in users} | {"local": "local"}
        if by == "key":
            keys = {k.id: f"{k.prefix}... ({k.name}, {u.name})" for u in users for k in accounts.keys(u)}
            names = keys | {"": "(login)"}
    return [UsageRow(group=t.group, label=names.get(t.group, t.group if by not in ("user", "key") else
                                                    f"(removed {t.group})"),
                     requests=t.requests, prompt_tokens=t.prompt_tokens, cached_tokens=t.cached_tokens,
                     completion_tokens=t.completion_tokens) for t in usage.totals(by, only)]
