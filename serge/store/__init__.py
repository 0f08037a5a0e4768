"""Storage of chats, messages, their documents and accounts: SQLAlchemy tables, sessions and Alembic migrations.

Nothing here knows about the engine or HTTP; every chat query is scoped by owner.
"""

from serge.store.people.accounts import (
    LOCAL_OWNER, AccountStore, KeyNotFound, KeyRecord, LastAdmin, NameTaken, UserNotFound, UserRecord,
)
from serge.store.chats import (MESSAGE_FIELDS, ChatNotFound, ChatRecord, ChatStore, MessageNotFound, MessageRecord,
                               NewMessage)
from serge.store.collections import (CollectionExists, CollectionNotFound, CollectionRecord, CollectionStore,
                                     FileProgress)
from serge.store.documents import ChunkHit, DocumentNotFound, DocumentRecord, DocumentStore, FileStore, NewChunk
from serge.store.presets import PresetExists, PresetNotFound, PresetRecord, PresetStore
from serge.store.decisions import DecisionRecord, DecisionStore
from serge.store.db import Database, DatabaseUnavailable, exposed, private_dir
from serge.store.responses import ResponseNotFound, ResponseRecord, ResponseStore
from serge.store.tools import (ToolServerConnection, ToolServerExists, ToolServerMissing, ToolServerRecord,
                               ToolServerStore)
from serge.store.usage.ledger import QuotaRecord, UsageCount, UsageFilter, UsageStore, UsageTotal

__all__ = [
    "CollectionExists", "CollectionNotFound", "CollectionRecord", "CollectionStore", "FileProgress",
    "PresetExists", "PresetNotFound", "PresetRecord", "PresetStore",
    "LOCAL_OWNER", "MESSAGE_FIELDS", "AccountStore", "ChatNotFound", "ChunkHit", "DocumentNotFound", "DocumentRecord",
    "DocumentStore", "FileStore", "NewChunk", "ChatRecord", "ChatStore", "Database", "DatabaseUnavailable",
    "KeyNotFound",
    "KeyRecord", "LastAdmin", "MessageNotFound", "MessageRecord", "NameTaken", "NewMessage", "ResponseNotFound",
    "ResponseRecord", "ResponseStore", "UserNotFound", "UserRecord", "exposed", "private_dir",
    "ToolServerConnection", "ToolServerExists", "ToolServerMissing", "ToolServerRecord", "ToolServerStore",
    "DecisionRecord", "DecisionStore",
    "QuotaRecord", "UsageCount", "UsageFilter", "UsageStore", "UsageTotal",
]
