"""Storage of chats, messages and accounts: SQLAlchemy tables, sessions and Alembic migrations.

Nothing here knows about the engine or HTTP; every chat query is scoped by owner.
"""

from serge.store.accounts import (
    LOCAL_OWNER, AccountStore, KeyNotFound, KeyRecord, LastAdmin, NameTaken, UserNotFound, UserRecord,
)
from serge.store.chats import (MESSAGE_FIELDS, ChatNotFound, ChatRecord, ChatStore, MessageNotFound, MessageRecord,
                               NewMessage)
from serge.store.db import Database, DatabaseUnavailable, exposed, private_dir

__all__ = [
    "LOCAL_OWNER", "MESSAGE_FIELDS", "AccountStore", "ChatNotFound", "ChatRecord", "ChatStore", "Database", "DatabaseUnavailable",
    "KeyNotFound",
    "KeyRecord", "LastAdmin", "MessageNotFound", "MessageRecord", "NameTaken", "NewMessage", "UserNotFound",
    "UserRecord", "exposed", "private_dir",
]
