"""Storage of chats and messages: SQLAlchemy tables, sessions and Alembic migrations.

Nothing here knows about the engine or HTTP; every query is scoped by owner.
"""

from serge.store.chats import ChatNotFound, ChatRecord, ChatStore, MessageNotFound, MessageRecord, NewMessage
from serge.store.db import Database

__all__ = ["ChatNotFound", "ChatRecord", "ChatStore", "Database", "MessageNotFound", "MessageRecord", "NewMessage"]
