"""The account repository: users, their API keys and login sessions, returning frozen records.

It stores and finds hashes; it never sees a password, a key or a session token
in the clear, and it decides nothing about what makes a good password (that is
`serge.accounts`). Keys are always looked up with their owner, so one user can
never list or revoke another's.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, func, or_, select, update
from sqlalchemy.exc import IntegrityError

from serge.store.chats import new_id
from serge.store.db import Database
from serge.store.tables import (ApiKey, Chat, Collection, Document, DocumentChunk, GroupMember, LoginSession, Message,
                               Preset, User, now)

LOCAL_OWNER = "local"  # owner of the chats made while Serge had no accounts
KEY_TOUCH_EVERY = timedelta(minutes=1)  # last_used_at is written at most this often per key


class UserNotFound(LookupError):
    pass


class NameTaken(ValueError):
    pass


class KeyNotFound(LookupError):
    pass


class LastAdmin(ValueError):
    """Removing this user would leave the others with no admin."""


@dataclass(frozen=True)
class UserRecord:
    id: str
    name: str
    admin: bool
    created_at: datetime
    signed_in_by: str = "password"  # or "oidc": how they prove who they are
    email: str | None = None
    pending: bool = False  # made at a first sign-in, waiting for an admin's approval

    @classmethod
    def of(cls, row: User) -> UserRecord:
        return cls(id=row.id, name=row.name, admin=row.admin, created_at=row.created_at,
                   signed_in_by=row.signed_in_by or "password", email=row.email, pending=bool(row.pending))


@dataclass(frozen=True)
class KeyRecord:
    id: str
    user_id: str
    name: str
    prefix: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None

    @property
    def active(self) -> bool:
        return self.revoked_at is None

    @classmethod
    def of(cls, row: ApiKey) -> KeyRecord:
        return cls(id=row.id, user_id=row.user_id, name=row.name, prefix=row.prefix, created_at=row.created_at,
                   last_used_at=row.last_used_at, revoked_at=row.revoked_at)


class AccountStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    # --- users ----------------------------------------------------------------
    def has_users(self) -> bool:
        with self.db.session() as session:
            return session.scalar(select(User.id).limit(1)) is not None

    def add_user(self, name: str, password_hash: str, *, admin: bool) -> UserRecord:
        """Add a user. The first one is an admin whatever `admin` says, and takes over the local chats."""
        try:
            with self.db.session() as session, session.begin():
                row = User(id=new_id(), name=name, password_hash=password_hash, admin=admin, created_at=now())
                session.add(row)
                session.flush()  # counted after our own insert: a second writer waits for this transaction
                if session.scalar(select(func.count()).select_from(User)) == 1:
                    row.admin = True
                    session.execute(update(Chat).where(Chat.owner == LOCAL_OWNER).values(owner=row.id))
        except IntegrityError:
            raise NameTaken(f"there is already a user named {name!r}") from None
        return UserRecord.of(row)

    def users(self) -> list[UserRecord]:
        with self.db.session() as session:
            return [UserRecord.of(r) for r in session.scalars(select(User).order_by(User.name))]

    def _user(self, session, name: str) -> User:
        row = session.scalar(select(User).where(User.name == name))
        if row is None:
            raise UserNotFound(f"there is no user named {name!r}")
        return row

    def user(self, name: str) -> UserRecord:
        with self.db.session() as session:
            return UserRecord.of(self._user(session, name))

    def approve(self, name: str) -> UserRecord:
        """A pending user may use Serge from now on (approving twice is harmless)."""
        with self.db.session() as session, session.begin():
            row = self._user(session, name)
            row.pending = False
            return UserRecord.of(row)

    def credentials(self, name: str) -> tuple[UserRecord, str] | None:
        """The user and their password hash, for a login; None when there is no such user."""
        with self.db.session() as session:
            row = session.scalar(select(User).where(User.name == name))
            return (UserRecord.of(row), row.password_hash) if row else None

    def set_password(self, name: str, password_hash: str, *, revoke_keys: bool = True) -> int:
        """Change a password and end every session of that user, and (unless told not to) revoke their keys,
        in one transaction; the number of keys revoked."""
        with self.db.session() as session, session.begin():
            row = self._user(session, name)
            row.password_hash = password_hash
            session.execute(delete(LoginSession).where(LoginSession.user_id == row.id))
            if not revoke_keys:
                return 0
            revoked = session.execute(update(ApiKey).where(ApiKey.user_id == row.id, ApiKey.revoked_at.is_(None))
                                      .values(revoked_at=now()))
            return revoked.rowcount or 0

    def remove_user(self, name: str) -> int:
        """Remove a user with their chats, collections, own presets, keys and sessions; the number of chats
        removed."""
        with self.db.session() as session, session.begin():
            row = self._user(session, name)
            if row.admin and session.scalar(select(func.count()).select_from(User).where(User.admin)) == 1 \
                    and session.scalar(select(func.count()).select_from(User)) > 1:
                raise LastAdmin(f"{name!r} is the last admin; add another admin before removing them")
            chats = select(Chat.id).where(Chat.owner == row.id)
            count = session.scalar(select(func.count()).select_from(chats.subquery())) or 0
            # children before parents, without relying on the database's cascade order
            session.execute(update(Message).where(Message.chat_id.in_(chats)).values(parent_id=None))
            session.execute(delete(Message).where(Message.chat_id.in_(chats)))
            documents = select(Document.id).where(Document.owner == row.id)
            session.execute(delete(DocumentChunk).where(DocumentChunk.document_id.in_(documents)))
            session.execute(delete(Document).where(Document.owner == row.id))
            session.execute(delete(Collection).where(Collection.owner == row.id))
            session.execute(delete(Preset).where(Preset.owner == row.id))  # their own; those for everyone stay
            session.execute(delete(Chat).where(Chat.owner == row.id))
            session.execute(delete(ApiKey).where(ApiKey.user_id == row.id))
            session.execute(delete(LoginSession).where(LoginSession.user_id == row.id))
            session.execute(delete(GroupMember).where(GroupMember.user_id == row.id))
            session.delete(row)
        return count

    # --- API keys -------------------------------------------------------------
    def add_key(self, user_id: str, name: str, prefix: str, key_hash: str) -> KeyRecord:
        with self.db.session() as session, session.begin():
            row = ApiKey(id=new_id(), user_id=user_id, name=name, prefix=prefix, key_hash=key_hash, created_at=now())
            session.add(row)
        return KeyRecord.of(row)

    def keys(self, user_id: str) -> list[KeyRecord]:
        """The user's keys, revoked ones included, newest first."""
        with self.db.session() as session:
            rows = session.scalars(select(ApiKey).where(ApiKey.user_id == user_id)
                                   .order_by(ApiKey.created_at.desc(), ApiKey.id))
            return [KeyRecord.of(r) for r in rows]

    def revoke_key(self, user_id: str, ref: str) -> KeyRecord:
        """Revoke the user's key whose id or visible prefix is `ref` (revoking twice is harmless)."""
        with self.db.session() as session, session.begin():
            rows = list(session.scalars(select(ApiKey).where(
                ApiKey.user_id == user_id, or_(ApiKey.id == ref, ApiKey.prefix == ref))))
            if len(rows) != 1:
                raise KeyNotFound(f"no key {ref!r} of this user" if not rows
                                  else f"{ref!r} names {len(rows)} keys; give the key's id instead")
            row = rows[0]
            row.revoked_at = row.revoked_at or now()
        return KeyRecord.of(row)

    def user_for_key(self, key_hash: str) -> tuple[UserRecord, str] | None:
        """The owner of an active key and the key's id, noting when it was last used."""
        with self.db.session() as session:
            found = session.execute(select(ApiKey, User).join(User, User.id == ApiKey.user_id)
                                    .where(ApiKey.key_hash == key_hash, ApiKey.revoked_at.is_(None))).first()
            if found is None:
                return None
            key, user = found
            record, last_used, key_id = UserRecord.of(user), key.last_used_at, key.id
        stamp = now()
        if last_used is None or stamp - last_used > KEY_TOUCH_EVERY:  # written apart from the read: no lock upgrade
            with self.db.session() as session, session.begin():
                session.execute(update(ApiKey).where(ApiKey.id == key_id).values(last_used_at=stamp))
        return record, key_id

    # --- login sessions -------------------------------------------------------
    def add_session(self, token_hash: str, user_id: str, lifetime: timedelta) -> None:
        """Start a session; sessions past their end are cleared out on the way."""
        with self.db.session() as session, session.begin():
            stamp = now()
            session.execute(delete(LoginSession).where(LoginSession.expires_at < stamp))
            session.add(LoginSession(token_hash=token_hash, user_id=user_id, created_at=stamp,
                                     expires_at=stamp + lifetime))

    def user_for_session(self, token_hash: str) -> UserRecord | None:
        with self.db.session() as session:
            row = session.scalar(select(User).join(LoginSession, LoginSession.user_id == User.id)
                                 .where(LoginSession.token_hash == token_hash, LoginSession.expires_at > now()))
            return UserRecord.of(row) if row else None

    def end_session(self, token_hash: str) -> None:
        with self.db.session() as session, session.begin():
            session.execute(delete(LoginSession).where(LoginSession.token_hash == token_hash))
