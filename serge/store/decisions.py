"""The SQL of tool calls waiting for an answer: a row per call, answered once, by any process.

A chat's call that needs a person's Allow or Deny is a row in "waiting" while its reply waits;
an answer (from any process, any tab) turns it into "allowed" or "denied" with one conditional
UPDATE, so two answers cannot both win, and sends a notice on `DECISION_CHANNEL` that wakes the
waiting reply in whichever process runs it. The Responses API's approval requests are rows too:
the request that answers one takes it, and a second answer of the same id finds it taken.
What an answer means for a reply is the chat service's business (serge/chats/tools).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError

from serge.store.db import Database
from serge.store.tables import ToolDecision, now

WAITING, ALLOWED, DENIED = "waiting", "allowed", "denied"
DECISION_CHANNEL = "serge_decision"


@dataclass(frozen=True)
class DecisionRecord:
    id: str
    owner: str
    chat_id: str | None
    server: str
    tool: str
    arguments: str
    state: str
    always: bool

    @classmethod
    def of(cls, row: ToolDecision) -> DecisionRecord:
        return cls(row.id, row.owner, row.chat_id, row.server, row.tool, row.arguments, row.state, row.always)


class DecisionStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def ask(self, id: str, owner: str, chat_id: str | None, server: str, tool: str, arguments: str) -> None:
        """A call now waits for an answer (asked again under the same id: it waits again)."""
        with self.db.session() as session, session.begin():
            session.execute(delete(ToolDecision).where(ToolDecision.id == id))
            session.add(ToolDecision(id=id[:64], owner=owner, chat_id=chat_id, server=server[:64], tool=tool[:128],
                                     arguments=arguments, state=WAITING, always=False, created_at=now()))

    def answer(self, id: str, owner: str, allow: bool, always: bool = False, chat_id: str | None = None) -> bool:
        """Answer a waiting call of `owner` (of that chat, given `chat_id`); False when none waits by that id."""
        query = update(ToolDecision).where(ToolDecision.id == id, ToolDecision.owner == owner,
                                           ToolDecision.state == WAITING)
        if chat_id is not None:
            query = query.where(ToolDecision.chat_id == chat_id)
        with self.db.session() as session, session.begin():
            result = session.execute(query.values(state=ALLOWED if allow else DENIED, always=allow and always,
                                                  decided_at=now()))
            if result.rowcount != 1:
                return False
            self.db.notices.send(session, DECISION_CHANNEL, id)
            return True

    def answer_once(self, id: str, owner: str, allow: bool) -> bool:
        """Take an approval request's answer: True for the first answer of `id`, False ever after (a retry, a
        second client). A request asked before its row existed is taken by inserting it answered."""
        if self.answer(id, owner, allow):
            return True
        try:
            with self.db.session() as session, session.begin():
                session.add(ToolDecision(id=id[:64], owner=owner, chat_id=None, server="", tool="", arguments="",
                                         state=ALLOWED if allow else DENIED, always=False, created_at=now(),
                                         decided_at=now()))
            return True
        except IntegrityError:
            return False

    def get(self, id: str) -> DecisionRecord | None:
        with self.db.session() as session:
            row = session.get(ToolDecision, id)
            return DecisionRecord.of(row) if row else None

    def waiting(self, owner: str, chat_id: str) -> list[DecisionRecord]:
        """The chat's calls waiting for an answer, oldest first."""
        with self.db.session() as session:
            return [DecisionRecord.of(row) for row in session.scalars(
                select(ToolDecision).where(ToolDecision.owner == owner, ToolDecision.chat_id == chat_id,
                                           ToolDecision.state == WAITING).order_by(ToolDecision.created_at))]

    def forget(self, id: str) -> None:
        """A chat's call is over (run, denied, stopped): its row goes."""
        with self.db.session() as session, session.begin():
            session.execute(delete(ToolDecision).where(ToolDecision.id == id))
