"""The tables: a chat, its messages as a tree, the accounts that own chats, and stored Responses API replies.

Each message points at the one before it (`parent_id`). Regenerating a reply or
editing a user message adds a sibling instead of overwriting, so every earlier
version stays as an alternative; `chats.current_id` is the newest message of the
branch the user is looking at. It is a plain column, not a foreign key, so chats
and messages never depend on each other in a cycle.

`chats.owner` holds a user's id, or "local" for chats made before any account
existed; it is not a foreign key, so a Serge without accounts needs no user row.
Secrets are never stored: API keys and login sessions are kept as SHA-256 hashes
of random tokens, passwords as argon2 hashes.
"""

from __future__ import annotations

from datetime import UTC, date, datetime

from sqlalchemy import (JSON, BigInteger, Boolean, Date, DateTime, Float, ForeignKey, Index, Integer, LargeBinary,
                        String, Text, TypeDecorator)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql.expression import false as sa_false


class UTCDateTime(TypeDecorator):
    """Aware UTC datetimes in and out, also on SQLite, which forgets the zone."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value

    def process_result_value(self, value, dialect):
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value


def now() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    pass


class Chat(Base):
    __tablename__ = "chats"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64), index=True)
    title: Mapped[str] = mapped_column(String(200))
    model: Mapped[str | None] = mapped_column(String(200))
    system_prompt: Mapped[str | None] = mapped_column(Text)
    settings: Mapped[dict] = mapped_column(JSON, default=dict)
    knowledge: Mapped[list | None] = mapped_column(JSON)  # the ids of the collections every reply searches
    tools: Mapped[list | None] = mapped_column(JSON)  # the names of the MCP servers whose tools replies may call
    tool_approvals: Mapped[list | None] = mapped_column(JSON)  # "server/tool" the user always allows in this chat
    tool_choice: Mapped[str | None] = mapped_column(String(16))  # None/auto, first or always (see ChatRecord)
    current_id: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=now)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=now)

    __table_args__ = (Index("ix_chats_owner_updated", "owner", "updated_at"),)


class Message(Base):
    __tablename__ = "messages"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    chat_id: Mapped[str] = mapped_column(ForeignKey("chats.id", ondelete="CASCADE"), index=True)
    parent_id: Mapped[str | None] = mapped_column(ForeignKey("messages.id", ondelete="CASCADE"), index=True)
    role: Mapped[str] = mapped_column(String(16))
    content: Mapped[str] = mapped_column(Text, default="")
    # a thinking model's reply: its thoughts, apart from `content`, and the tokens it spent on them
    reasoning: Mapped[str | None] = mapped_column(Text)
    reasoning_tokens: Mapped[int | None] = mapped_column(Integer)
    model: Mapped[str | None] = mapped_column(String(200))
    settings: Mapped[dict | None] = mapped_column(JSON)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    seed: Mapped[str | None] = mapped_column(String(24))  # up to 2**63: past what some JSON readers keep exact
    queued_s: Mapped[float | None] = mapped_column(Float)
    ttft_s: Mapped[float | None] = mapped_column(Float)
    duration_s: Mapped[float | None] = mapped_column(Float)
    tokens_per_s: Mapped[float | None] = mapped_column(Float)
    # stop, length, cancelled, error, or interrupted (the server died mid-reply); None while it streams
    finish_reason: Mapped[str | None] = mapped_column(String(16))
    complete: Mapped[bool] = mapped_column(Boolean, default=True)
    error: Mapped[str | None] = mapped_column(Text)
    # a reply's: how many of the chat's oldest messages were left out of the model's view to fit its context
    dropped_messages: Mapped[int | None] = mapped_column(Integer)
    attachments: Mapped[list | None] = mapped_column(JSON)  # a user message's: the ids of its documents
    knowledge: Mapped[list | None] = mapped_column(JSON)  # a user message's: the collections it named
    sources: Mapped[list | None] = mapped_column(JSON)  # a reply's: the passages it was given, with their scores
    tool_calls: Mapped[list | None] = mapped_column(JSON)  # a reply's: the tools it called, their arguments and results
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=now)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=now)


class Collection(Base):
    """A named set of files an account uploads once for any of its chats; `revision` grows with every change."""

    __tablename__ = "collections"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64), index=True)
    name: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=now)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=now)

    __table_args__ = (Index("ix_collections_owner_name", "owner", "name", unique=True),)


class Document(Base):
    """A file given to a chat or to a collection (one of the two): its bytes are kept once in the data dir under
    `sha256`, its text here by page. A collection's file is indexed in the background: `state` says how far."""

    __tablename__ = "documents"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64), index=True)
    chat_id: Mapped[str | None] = mapped_column(ForeignKey("chats.id", ondelete="CASCADE"), index=True)
    collection_id: Mapped[str | None] = mapped_column(ForeignKey("collections.id", ondelete="CASCADE"), index=True)
    # queued, indexing, indexed, failed (`error` says why) or cancelled; a chat's file is indexed when stored
    state: Mapped[str] = mapped_column(String(16), default="indexed")
    error: Mapped[str | None] = mapped_column(Text)
    chunks_total: Mapped[int | None] = mapped_column(Integer)  # known once the file is read
    revision: Mapped[int] = mapped_column(Integer, default=0)  # grows whenever its passages change
    # while `indexing`: when its indexer last said it was at work on it (a stale one is taken over)
    claimed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    name: Mapped[str] = mapped_column(String(255))
    media_type: Mapped[str] = mapped_column(String(100))
    size_bytes: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    pages: Mapped[list] = mapped_column(JSON, default=list)  # the text of page 1, 2, ...
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=now)


class DocumentChunk(Base):
    """A passage of a document, with its page and its vector (float32 bytes; None where none could be made).

    On SQLite a full-text index over `text` (FTS5, made by the migration) follows this table by triggers.
    """

    __tablename__ = "document_chunks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    document_id: Mapped[str] = mapped_column(ForeignKey("documents.id", ondelete="CASCADE"), index=True)
    seq: Mapped[int] = mapped_column(Integer)
    page: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    embedding: Mapped[bytes | None] = mapped_column(LargeBinary)


# SQLite's FTS5 index over document_chunks.text, and the shadow tables FTS5 keeps beside it (`_data`, `_idx`, ...):
# made by migration 0006, with no model here, since SQLAlchemy cannot describe a virtual table.
FULL_TEXT_TABLE = "document_chunks_fts"
# PostgreSQL's: document_chunks.text parsed once (a generated, stored tsvector with a GIN index), made by 0007.
FULL_TEXT_COLUMN = "text_search"
FULL_TEXT_INDEX = "ix_document_chunks_text_search"


class User(Base):
    __tablename__ = "users"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    password_hash: Mapped[str] = mapped_column(String(255))
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=now)
    signed_in_by: Mapped[str] = mapped_column(String(16), default="password", server_default="password")
    external_id: Mapped[str | None] = mapped_column(String(320), unique=True, index=True)  # "oidc:{issuer}#{sub}"
    email: Mapped[str | None] = mapped_column(String(320))
    pending: Mapped[bool] = mapped_column(Boolean, default=False, server_default=sa_false())  # until approved


class UserGroup(Base):
    """A group of users: made by an admin (source "serge") or named by an identity provider ("oidc")."""

    __tablename__ = "user_groups"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    source: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=now)


class GroupMember(Base):
    __tablename__ = "group_members"

    group_id: Mapped[str] = mapped_column(ForeignKey("user_groups.id", ondelete="CASCADE"), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True, index=True)


class Share(Base):
    """A model or preset shared with a group: once one is, only that group's members (and admins) may use it."""

    __tablename__ = "shares"

    kind: Mapped[str] = mapped_column(String(16), primary_key=True)  # "model" or "preset"
    name: Mapped[str] = mapped_column(String(200), primary_key=True)  # lowercased
    group_id: Mapped[str] = mapped_column(ForeignKey("user_groups.id", ondelete="CASCADE"), primary_key=True,
                                          index=True)


class CollectionShare(Base):
    """A knowledge collection shared with a group (`group_id` "*": with everyone): its members read and search it;
    only its owner (and admins) change it. A collection with no row is its owner's alone."""

    __tablename__ = "collection_shares"

    collection_id: Mapped[str] = mapped_column(ForeignKey("collections.id", ondelete="CASCADE"), primary_key=True)
    group_id: Mapped[str] = mapped_column(String(32), primary_key=True, index=True)


class AuditEntry(Base):
    """An admin action: who, what, on what, when (users, groups, shares, quotas, tool servers, presets, models)."""

    __tablename__ = "audit_log"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    actor: Mapped[str] = mapped_column(String(100))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(500))


class PendingSignIn(Base):
    """A sign-in sent to an identity provider and not yet back: used once, by the state it was sent with."""

    __tablename__ = "pending_sign_ins"

    state_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    nonce: Mapped[str] = mapped_column(String(128))
    code_verifier: Mapped[str] = mapped_column(String(128))
    redirect_uri: Mapped[str] = mapped_column(String(1000))
    next: Mapped[str] = mapped_column(String(2000))
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)


class ProviderGrant(Base):
    """An identity provider's refresh token for one user, sealed (encrypted) by serge.accounts: what lets Serge ask
    the provider, later, whether the person may still sign in. `redeeming_until`: a process is redeeming it."""

    __tablename__ = "provider_grants"

    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)
    sealed: Mapped[str] = mapped_column(Text)
    kept_at: Mapped[datetime] = mapped_column(UTCDateTime, default=now)
    checked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    redeeming_until: Mapped[datetime | None] = mapped_column(UTCDateTime)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    prefix: Mapped[str] = mapped_column(String(32))  # the start of the key, shown to tell keys apart
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=now)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class LoginSession(Base):
    __tablename__ = "login_sessions"

    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=now)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)


class StoredResponse(Base):
    """A reply of OpenAI's Responses API kept for `previous_response_id` and `GET /v1/responses/{id}`.

    Items are kept as the API writes them (JSON lists): the request's input items and the reply's output
    items; `request` holds what the response object echoes of its request (instructions, tools, ...).
    """

    __tablename__ = "responses"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64), index=True)
    model: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=now)
    status: Mapped[str] = mapped_column(String(16))  # completed or incomplete
    previous_response_id: Mapped[str | None] = mapped_column(String(64))  # not a foreign key: it may be deleted
    input_items: Mapped[list] = mapped_column(JSON, default=list)
    output_items: Mapped[list] = mapped_column(JSON, default=list)
    usage: Mapped[dict] = mapped_column(JSON, default=dict)
    request: Mapped[dict] = mapped_column(JSON, default=dict)


class McpServer(Base):
    """An MCP server an admin registered: a stdio command Serge starts, or a streamable-HTTP URL.

    `headers` and `env` may hold secrets: they are read only to connect, never listed nor logged.
    """

    __tablename__ = "mcp_servers"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    command: Mapped[list | None] = mapped_column(JSON)  # argv of a stdio server
    url: Mapped[str | None] = mapped_column(Text)  # of a streamable-HTTP (or SSE) server
    headers: Mapped[dict] = mapped_column(JSON, default=dict)
    env: Mapped[dict] = mapped_column(JSON, default=dict)
    admins_only: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=now)


class RunningReply(Base):
    """A chat's reply being generated by one Serge process, for every process sharing a server database to see.

    One row per chat (its key): a second reply to the chat is refused in whichever process asks. The owning
    process renews `heartbeat_at`; a row whose heartbeat is older than the lease is a dead process's.
    """

    __tablename__ = "running_replies"

    chat_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64))
    message_id: Mapped[str | None] = mapped_column(String(32))  # None while the reply starts
    process: Mapped[str] = mapped_column(String(64), index=True)
    stop_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=now)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime, default=now)


class UserStream(Base):
    """A streamed reply a signed-in user has open on one process: the per-user limit counts these rows."""

    __tablename__ = "user_streams"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(64), index=True)
    process: Mapped[str] = mapped_column(String(64), index=True)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime, default=now)


class UsageDay(Base):
    """What one user's key spent on one model through one dialect in one UTC day: counts, never text."""

    __tablename__ = "usage_days"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    day: Mapped[date] = mapped_column(Date)
    user_id: Mapped[str] = mapped_column(String(64))
    key_id: Mapped[str] = mapped_column(String(32))  # "" for a login session's request
    model: Mapped[str] = mapped_column(String(200))
    dialect: Mapped[str] = mapped_column(String(16))
    requests: Mapped[int] = mapped_column(BigInteger)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    cached_tokens: Mapped[int] = mapped_column(BigInteger)
    completion_tokens: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (Index("ix_usage_days_row", "day", "user_id", "key_id", "model", "dialect", unique=True),
                      Index("ix_usage_days_user_day", "user_id", "day"),
                      Index("ix_usage_days_key_day", "key_id", "day"))


class UsageMinute(Base):
    """Model requests of a user (`key_id` "") or of one of their keys in one minute since the epoch."""

    __tablename__ = "usage_minutes"

    user_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    key_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    minute: Mapped[int] = mapped_column(BigInteger, primary_key=True, index=True)
    requests: Mapped[int] = mapped_column(Integer)


class UsageReservation(Base):
    """A model request in progress: the tokens it may still spend, counted against its user's and key's caps until
    it settles to its real usage (the row removed, the ledger added to). Renewed by its process's heartbeat."""

    __tablename__ = "usage_reservations"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(64), index=True)
    key_id: Mapped[str] = mapped_column(String(32))  # "" for a login session's request
    model: Mapped[str] = mapped_column(String(200))
    dialect: Mapped[str] = mapped_column(String(16))
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    completion_tokens: Mapped[int] = mapped_column(BigInteger)  # the budget: longest reply times choices
    process: Mapped[str] = mapped_column(String(64), index=True)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime, default=now)


class Quota(Base):
    """A cap: the account-wide default (kind "default", subject ""), a user's, a key's or a group's (its id); null: no cap
    of that kind."""

    __tablename__ = "quotas"

    kind: Mapped[str] = mapped_column(String(8), primary_key=True)
    subject: Mapped[str] = mapped_column(String(32), primary_key=True)
    tokens_per_day: Mapped[int | None] = mapped_column(BigInteger)
    tokens_per_month: Mapped[int | None] = mapped_column(BigInteger)
    requests_per_minute: Mapped[int | None] = mapped_column(Integer)


class Preset(Base):
    """A name people pick like a model's: a base model with a system prompt, settings, knowledge and tools.

    `owner` is the user it belongs to, or None for a preset an admin made for everyone; `author` is who made it,
    whose collections `knowledge` names (ids) and are searched for whoever uses it. `model` is a library name and
    not a foreign key: a model removed later leaves the preset saying so.
    """

    __tablename__ = "presets"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    owner: Mapped[str | None] = mapped_column(String(64), index=True)
    author: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(200))
    system_prompt: Mapped[str | None] = mapped_column(Text)
    settings: Mapped[dict] = mapped_column(JSON, default=dict)
    knowledge: Mapped[list] = mapped_column(JSON, default=list)
    tools: Mapped[list] = mapped_column(JSON, default=list)  # MCP servers by their registered names
    tool_choice: Mapped[str | None] = mapped_column(String(16))  # None/auto, first or always, as a chat's
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=now)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=now)

    # one name per owner; for everyone's presets (owner NULL) the service keeps names apart, since NULLs never clash
    __table_args__ = (Index("ix_presets_owner_name", "owner", "name", unique=True),)


class ToolDecision(Base):
    """A tool call that waits for a person's Allow or Deny, or an approval request a client answers: one row, so
    an answer reaches whichever process runs the call, and is taken once.

    `id` is the call's id (a chat's) or the approval request's (the Responses API's). `state` goes from "waiting"
    to "allowed" or "denied" once, by whoever answers first; `taken` is set by the process that acts on it.
    """

    __tablename__ = "tool_decisions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64), index=True)
    chat_id: Mapped[str | None] = mapped_column(String(32), index=True)  # None: an API conversation's
    server: Mapped[str] = mapped_column(String(64))
    tool: Mapped[str] = mapped_column(String(128))
    arguments: Mapped[str] = mapped_column(Text, default="")
    state: Mapped[str] = mapped_column(String(16), default="waiting")
    always: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=now)
    decided_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
