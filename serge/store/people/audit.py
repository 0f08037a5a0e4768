"""The audit log: admin actions (users, groups, shares, quotas, tool servers, presets, models), who did what to
what, and when, newest first.

`note` is called by the services that make each change, in the same process, after it succeeded; the actor
is whoever the request's context says is acting (`serge.access.acting`: a user's name, `cli:LOGIN` for the
`serge` command). Nothing here knows about HTTP; nothing recorded is a secret (no password, key or header).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select

from serge.access import actor
from serge.store.chats import new_id
from serge.store.db import Database
from serge.store.tables import AuditEntry, now

MAX_TARGET_CHARS = 500


@dataclass(frozen=True)
class AuditRecord:
    at: datetime
    actor: str
    action: str
    target: str


def note(db: Database, action: str, target: str) -> None:
    """Record an admin action that has just been done."""
    with db.session() as session, session.begin():
        session.add(AuditEntry(id=new_id(), at=now(), actor=actor()[:100], action=action,
                               target=target[:MAX_TARGET_CHARS]))


class AuditStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def note(self, action: str, target: str) -> None:
        note(self.db, action, target)

    def entries(self, limit: int = 500) -> list[AuditRecord]:
        """The newest `limit` entries, newest first."""
        with self.db.session() as session:
            rows = session.scalars(select(AuditEntry).order_by(AuditEntry.at.desc(), AuditEntry.id.desc())
                                   .limit(limit))
            return [AuditRecord(r.at, r.actor, r.action, r.target) for r in rows]
