"""The chat repository: owner-scoped reads and writes, returning frozen records.

Every method takes the owner and never touches another owner's rows; a chat
that exists but belongs to someone else is simply "not found". Records are plain
frozen dataclasses, so no SQLAlchemy session ever leaves this module.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime

from sqlalchemy import delete, func, or_, select, update
from sqlalchemy.orm import Session

from serge.store.db import Database
from serge.store.tables import Chat, Message, now

CHAT_FIELDS = ("title", "model", "system_prompt", "settings", "knowledge", "tools", "tool_approvals", "tool_choice")


class ChatNotFound(LookupError):
    pass


class MessageNotFound(LookupError):
    pass


def new_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class MessageRecord:
    """A stored message with its reply statistics: the one record the store, the chat API, export and import use."""

    id: str
    chat_id: str
    parent_id: str | None
    role: str
    content: str
    reasoning: str | None  # a thinking model's thoughts before `content`; None for one that did not think
    reasoning_tokens: int | None
    model: str | None
    settings: dict | None
    prompt_tokens: int | None
    completion_tokens: int | None
    seed: str | None
    queued_s: float | None
    ttft_s: float | None
    duration_s: float | None
    tokens_per_s: float | None
    finish_reason: str | None
    complete: bool
    error: str | None
    dropped_messages: int | None
    attachments: list | None  # a user message's: the ids of the documents it came with
    knowledge: list | None  # a user message's: the ids of the collections it named
    sources: list | None  # a reply's: the passages of documents it was given (document_id, file, page, passage, score)
    created_at: datetime
    updated_at: datetime
    alternatives: tuple[str, ...] = ()  # this message and its siblings, oldest first
    # a reply's: the tools it called, in order ({server, tool, arguments, state, result, is_error, cut, ...})
    tool_calls: list | None = None

    @property
    def status(self) -> str:
        """complete, length (cut at max tokens), stopped, error, interrupted, or streaming."""
        if self.finish_reason is None:
            return "complete" if self.complete else "streaming"
        return {"stop": "complete", "cancelled": "stopped"}.get(self.finish_reason, self.finish_reason)

    @classmethod
    def of(cls, row: Message, alternatives: tuple[str, ...] = ()) -> MessageRecord:
        return cls(
            id=row.id, chat_id=row.chat_id, parent_id=row.parent_id,
            **{k: getattr(row, k) for k in MESSAGE_FIELDS},
            created_at=row.created_at, updated_at=row.updated_at, alternatives=alternatives,
        )


# What a message says (as opposed to where it sits in the tree and when it was written): the
# fields a finished reply writes, an import reads and an export keeps.
MESSAGE_FIELDS = tuple(f.name for f in fields(MessageRecord)
                       if f.name not in ("id", "chat_id", "parent_id", "created_at", "updated_at", "alternatives"))


@dataclass(frozen=True)
class NewMessage:
    """A message to add; `parent_id` None with `after_current` puts it after the chat's current one."""

    role: str
    content: str
    parent_id: str | None = None
    after_current: bool = True
    model: str | None = None
    settings: dict | None = None
    complete: bool = True
    finish_reason: str | None = None
    attachments: list[str] | None = None
    knowledge: list[str] | None = None


@dataclass(frozen=True)
class ChatRecord:
    id: str
    owner: str
    title: str
    model: str | None
    system_prompt: str | None
    settings: dict
    current_id: str | None
    created_at: datetime
    updated_at: datetime
    knowledge: tuple[str, ...] = ()  # the ids of the collections every reply of the chat searches
    messages: tuple[MessageRecord, ...] = field(default=())  # the branch on screen, oldest first
    tools: tuple[str, ...] = ()  # the MCP servers whose tools its replies may call
    tool_approvals: tuple[str, ...] = ()  # "server/tool" that run without asking, in this chat
    tool_choice: str = "auto"  # auto, or "first"/"always": the first/every step must call a tool (steering)

    @classmethod
    def of(cls, row: Chat, messages: tuple[MessageRecord, ...] = ()) -> ChatRecord:
        return cls(
            id=row.id, owner=row.owner, title=row.title, model=row.model, system_prompt=row.system_prompt,
            settings=dict(row.settings or {}), current_id=row.current_id, created_at=row.created_at,
            knowledge=tuple(row.knowledge or ()),
            updated_at=row.updated_at, messages=messages, tools=tuple(row.tools or ()),
            tool_approvals=tuple(row.tool_approvals or ()), tool_choice=row.tool_choice or "auto",
        )


def _children(rows: Iterable[Message]) -> dict[str | None, list[Message]]:
    kids: dict[str | None, list[Message]] = {}
    for row in sorted(rows, key=lambda r: (r.created_at, r.id)):
        kids.setdefault(row.parent_id, []).append(row)
    return kids


def _branch(rows: Sequence[Message], current_id: str | None) -> tuple[MessageRecord, ...]:
    """The path from the first message down to `current_id`, each with its alternatives."""
    by_id = {r.id: r for r in rows}
    kids = _children(rows)
    path: list[Message] = []
    node = by_id.get(current_id) if current_id else None
    while node is not None:
        path.append(node)
        node = by_id.get(node.parent_id) if node.parent_id else None
    return tuple(
        MessageRecord.of(r, tuple(s.id for s in kids.get(r.parent_id, []))) for r in reversed(path)
    )


def _newest_leaf(rows: Sequence[Message], start: Message) -> Message:
    kids = _children(rows)
    node = start
    while kids.get(node.id):
        node = kids[node.id][-1]
    return node


class ChatStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    # --- chats ----------------------------------------------------------------
    def _chat(self, session: Session, owner: str, chat_id: str) -> Chat:
        row = session.scalar(select(Chat).where(Chat.id == chat_id, Chat.owner == owner))
        if row is None:
            raise ChatNotFound(f"no chat with id {chat_id!r}")
        return row

    def _rows(self, session: Session, chat_id: str) -> list[Message]:
        return list(session.scalars(select(Message).where(Message.chat_id == chat_id)))

    def create_chat(self, owner: str, *, title: str, model: str | None = None, system_prompt: str | None = None,
                    settings: dict | None = None, knowledge: Sequence[str] = (), tools: Sequence[str] = (),
                    tool_choice: str | None = None) -> ChatRecord:
        with self.db.session() as session, session.begin():
            stamp = now()
            row = Chat(id=new_id(), owner=owner, title=title, model=model, system_prompt=system_prompt,
                       settings=settings or {}, created_at=stamp, updated_at=stamp)
            if knowledge:
                row.knowledge = list(knowledge)
            if tools:
                row.tools = list(tools)
            if tool_choice and tool_choice != "auto":
                row.tool_choice = tool_choice
            session.add(row)
        return ChatRecord.of(row)

    def list_chats(self, owner: str, query: str | None = None, limit: int = 500) -> list[ChatRecord]:
        """Newest activity first; `query` matches titles and message text, ignoring case."""
        stmt = select(Chat).where(Chat.owner == owner)
        if query:
            needle = query.lower()
            in_messages = select(Message.chat_id).where(
                func.lower(Message.content).contains(needle, autoescape=True)
            )
            stmt = stmt.where(or_(func.lower(Chat.title).contains(needle, autoescape=True), Chat.id.in_(in_messages)))
        stmt = stmt.order_by(Chat.updated_at.desc(), Chat.id).limit(limit)
        with self.db.session() as session:
            return [ChatRecord.of(row) for row in session.scalars(stmt)]

    def get_chat(self, owner: str, chat_id: str) -> ChatRecord:
        """The chat with the branch on screen."""
        with self.db.session() as session:
            row = self._chat(session, owner, chat_id)
            return ChatRecord.of(row, _branch(self._rows(session, chat_id), row.current_id))

    def update_chat(self, owner: str, chat_id: str, **changes) -> ChatRecord:
        unknown = set(changes) - set(CHAT_FIELDS)
        if unknown:
            raise ValueError(f"cannot change {sorted(unknown)}")
        with self.db.session() as session, session.begin():
            row = self._chat(session, owner, chat_id)
            for key, value in changes.items():
                setattr(row, key, value)
            row.updated_at = now()
        return self.get_chat(owner, chat_id)

    def delete_chat(self, owner: str, chat_id: str) -> None:
        with self.db.session() as session, session.begin():
            self._chat(session, owner, chat_id)
            # children before parents, without relying on the database's cascade order
            session.execute(update(Message).where(Message.chat_id == chat_id).values(parent_id=None))
            session.execute(delete(Message).where(Message.chat_id == chat_id))
            session.execute(delete(Chat).where(Chat.id == chat_id, Chat.owner == owner))

    # --- messages -------------------------------------------------------------
    def all_messages(self, owner: str, chat_id: str) -> list[MessageRecord]:
        """Every message of the chat, every branch, oldest first (for export)."""
        with self.db.session() as session:
            self._chat(session, owner, chat_id)
            rows = sorted(self._rows(session, chat_id), key=lambda r: (r.created_at, r.id))
            kids = _children(rows)
            return [MessageRecord.of(r, tuple(s.id for s in kids.get(r.parent_id, []))) for r in rows]

    def get_message(self, owner: str, chat_id: str, message_id: str) -> MessageRecord:
        with self.db.session() as session:
            self._chat(session, owner, chat_id)
            row = session.scalar(select(Message).where(Message.id == message_id, Message.chat_id == chat_id))
            if row is None:
                raise MessageNotFound(f"chat {chat_id!r} has no message {message_id!r}")
            return MessageRecord.of(row)

    def add_message(self, owner: str, chat_id: str, new: NewMessage) -> MessageRecord:
        """Add a message and make it the chat's current one."""
        with self.db.session() as session, session.begin():
            chat = self._chat(session, owner, chat_id)
            parent_id = chat.current_id if new.after_current and new.parent_id is None else new.parent_id
            parent = session.get(Message, parent_id) if parent_id is not None else None
            if parent_id is not None and (parent is None or parent.chat_id != chat_id):
                raise MessageNotFound(f"chat {chat_id!r} has no message {parent_id!r}")
            stamp = now()
            row = Message(
                id=new_id(), chat_id=chat_id, parent_id=parent_id, role=new.role, content=new.content,
                model=new.model, settings=new.settings, complete=new.complete, finish_reason=new.finish_reason,
                attachments=new.attachments, knowledge=new.knowledge, created_at=stamp, updated_at=stamp,
            )
            session.add(row)
            chat.current_id = row.id
            chat.updated_at = stamp
        return MessageRecord.of(row)

    def _owned(self, owner: str):
        return Message.chat_id.in_(select(Chat.id).where(Chat.owner == owner))

    def save_text(self, owner: str, message_id: str, content: str, reasoning: str | None = None) -> None:
        """Save a reply's text (and thoughts) so far (called about once a second while it streams)."""
        with self.db.session() as session, session.begin():
            session.execute(update(Message).where(Message.id == message_id, self._owned(owner))
                            .values(content=content, reasoning=reasoning, updated_at=now()))

    def finish_message(self, owner: str, message_id: str, **values) -> MessageRecord:
        """Write a reply's final text and stats, and touch its chat's last activity."""
        unknown = set(values) - set(MESSAGE_FIELDS)
        if unknown:
            raise ValueError(f"unknown message fields {sorted(unknown)}")
        with self.db.session() as session, session.begin():
            row = session.scalar(select(Message).where(Message.id == message_id, self._owned(owner)))
            if row is None:  # the chat was deleted while the reply streamed
                raise MessageNotFound(f"no message {message_id!r}")
            stamp = now()
            for key, value in values.items():
                setattr(row, key, value)
            row.updated_at = stamp
            session.execute(update(Chat).where(Chat.id == row.chat_id).values(updated_at=stamp))
        return MessageRecord.of(row)

    def select_branch(self, owner: str, chat_id: str, message_id: str) -> ChatRecord:
        """Show the branch through `message_id`: its newest continuation becomes current."""
        with self.db.session() as session, session.begin():
            chat = self._chat(session, owner, chat_id)
            rows = self._rows(session, chat_id)
            start = next((r for r in rows if r.id == message_id), None)
            if start is None:
                raise MessageNotFound(f"chat {chat_id!r} has no message {message_id!r}")
            chat.current_id = _newest_leaf(rows, start).id
        return self.get_chat(owner, chat_id)

    def mark_interrupted(self, except_chats: Iterable[str] = ()) -> int:
        """At start: replies that were streaming when the server died become `interrupted` (but those of
        `except_chats`, which another process sharing the database is still writing)."""
        busy = list(except_chats)
        with self.db.session() as session, session.begin():
            result = session.execute(
                update(Message)
                .where(Message.complete.is_(False), Message.finish_reason.is_(None),
                       *([Message.chat_id.not_in(busy)] if busy else []))
                .values(finish_reason="interrupted")
            )
            return result.rowcount or 0

    # --- import ---------------------------------------------------------------
    def import_chat(self, owner: str, chat: dict, messages: Sequence[dict], current: str | None) -> ChatRecord:
        """Insert a whole chat with fresh ids; `messages` refer to each other by their old ids.

        Messages must come parents first (as exports list them).
        """
        with self.db.session() as session, session.begin():
            stamp = now()
            row = Chat(id=new_id(), owner=owner, title=chat["title"], model=chat.get("model"),
                       system_prompt=chat.get("system_prompt"), settings=chat.get("settings") or {},
                       tools=chat.get("tools") or None, tool_approvals=chat.get("tool_approvals") or None,
                       tool_choice=chat.get("tool_choice") if chat.get("tool_choice") != "auto" else None,
                       created_at=chat.get("created_at") or stamp, updated_at=chat.get("updated_at") or stamp)
            session.add(row)
            session.flush()
            ids: dict[str, str] = {}
            for m in messages:
                parent = m.get("parent_id")
                if parent is not None and parent not in ids:
                    raise ValueError(f"message {m['id']!r} comes before its parent {parent!r}")
                ids[m["id"]] = new_id()
                session.add(Message(
                    id=ids[m["id"]], chat_id=row.id, parent_id=ids[parent] if parent else None,
                    **{k: m.get(k) for k in MESSAGE_FIELDS if k not in ("complete",)},
                    complete=bool(m.get("complete", True)),
                    created_at=m.get("created_at") or stamp, updated_at=m.get("updated_at") or stamp,
                ))
                session.flush()
            row.current_id = ids.get(current) if current else (ids[messages[-1]["id"]] if messages else None)
        return self.get_chat(owner, row.id)
