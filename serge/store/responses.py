"""The Responses API's repository: stored replies, owner-scoped, as frozen records.

A reply is written once, whole, when it has finished (nothing half-made is kept)
and read back by its id or as the chain its `previous_response_id`s make. Every
method takes the owner: another owner's reply is simply not found. What the items
say is the web layer's business; here they are JSON lists kept as given.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, select

from serge.store.db import Database
from serge.store.tables import StoredResponse, now

MAX_CHAIN = 1000  # replies one previous_response_id may reach back through


class ResponseNotFound(LookupError):
    """No stored reply by that id for this owner (it never existed, was deleted, or is someone else's)."""

    def __init__(self, response_id: str, param: str = "response_id") -> None:
        super().__init__(f"no stored response {response_id!r} (it was not stored, was deleted, or is another "
                         f"account's)")
        self.response_id, self.param = response_id, param


@dataclass(frozen=True)
class ResponseRecord:
    id: str
    owner: str
    model: str
    created_at: datetime
    status: str
    previous_response_id: str | None
    input_items: tuple[dict, ...]
    output_items: tuple[dict, ...]
    usage: dict
    request: dict

    @classmethod
    def of(cls, row: StoredResponse) -> ResponseRecord:
        return cls(id=row.id, owner=row.owner, model=row.model, created_at=row.created_at, status=row.status,
                   previous_response_id=row.previous_response_id, input_items=tuple(row.input_items or ()),
                   output_items=tuple(row.output_items or ()), usage=dict(row.usage or {}),
                   request=dict(row.request or {}))


class ResponseStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def add(self, owner: str, *, id: str, model: str, status: str, previous_response_id: str | None,
            input_items: list[dict], output_items: list[dict], usage: dict, request: dict,
            created_at: datetime | None = None) -> ResponseRecord:
        row = StoredResponse(id=id, owner=owner, model=model, status=status, created_at=created_at or now(),
                             previous_response_id=previous_response_id, input_items=input_items,
                             output_items=output_items, usage=usage, request=request)
        with self.db.session() as session, session.begin():
            session.add(row)
        return ResponseRecord.of(row)

    def get(self, owner: str, response_id: str, param: str = "response_id") -> ResponseRecord:
        with self.db.session() as session:
            row = session.get(StoredResponse, response_id)
            if row is None or row.owner != owner:
                raise ResponseNotFound(response_id, param)
            return ResponseRecord.of(row)

    def chain(self, owner: str, response_id: str) -> list[ResponseRecord]:
        """The reply and those before it, oldest first; a link that is gone (deleted) ends the chain there.
        ResponseNotFound (naming previous_response_id) when `response_id` itself is not this owner's."""
        found = [self.get(owner, response_id, "previous_response_id")]
        with self.db.session() as session:
            while (before := found[-1].previous_response_id) and len(found) < MAX_CHAIN:
                row = session.get(StoredResponse, before)
                if row is None or row.owner != owner:
                    break
                found.append(ResponseRecord.of(row))
        return found[::-1]

    def delete(self, owner: str, response_id: str) -> None:
        with self.db.session() as session, session.begin():
            done = session.execute(delete(StoredResponse).where(StoredResponse.id == response_id,
                                                                StoredResponse.owner == owner))
            if done.rowcount == 0:
                raise ResponseNotFound(response_id)

    def ids(self, owner: str) -> list[str]:
        with self.db.session() as session:
            return list(session.scalars(select(StoredResponse.id).where(StoredResponse.owner == owner)
                                        .order_by(StoredResponse.created_at)))
