"""`Accounts`: users with argon2-hashed passwords, and their API keys.

Passwords go through argon2id (argon2-cffi's defaults: 64 MiB and about 0.1-0.3 s
of CPU per check), at most two checks at a time so a flood of logins cannot
take the machine's memory. API keys are 256-bit random strings: a SHA-256 hash
is all that is stored, and checking a key costs one indexed lookup. A login for
a name that does not exist still verifies a hash, so the answer and its timing
do not tell whether the user exists. Nothing here knows about HTTP.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import threading
from datetime import UTC, datetime

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from serge.store.people.audit import note
from serge.store import LOCAL_OWNER, AccountStore, KeyRecord, UserRecord

NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
MIN_PASSWORD_CHARS = 8
MAX_PASSWORD_CHARS = 1024
MAX_KEY_NAME_CHARS = 100
KEY_PREFIX = "sk-serge-"
KEY_SHOWN_CHARS = 8  # random characters after KEY_PREFIX kept visible, to tell keys apart
HASHING_AT_ONCE = 2

# Who a request is when Serge has no accounts and the request comes from this machine.
LOCAL_USER = UserRecord(id=LOCAL_OWNER, name="local", admin=True, created_at=datetime(1970, 1, 1, tzinfo=UTC))


class InvalidAccountInput(ValueError):
    """Something the user can fix; `param` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class LoginFailed(Exception):
    """Wrong name or password; deliberately not saying which."""


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_name(name: str) -> str:
    """A user name, lower-cased: letters, digits, '.', '_' and '-', starting with a letter or digit."""
    cleaned = name.strip().lower()
    if not NAME_PATTERN.fullmatch(cleaned):
        raise InvalidAccountInput(
            "a user name is 1-64 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit",
            "name")
    return cleaned


def check_password(password: str) -> str:
    if not MIN_PASSWORD_CHARS <= len(password) <= MAX_PASSWORD_CHARS:
        raise InvalidAccountInput(
            f"a password is {MIN_PASSWORD_CHARS} to {MAX_PASSWORD_CHARS} characters; this one is {len(password)}",
            "password")
    try:
        password.encode()
    except UnicodeEncodeError:
        raise InvalidAccountInput("the password holds characters that are not valid Unicode text", "password") from None
    return password


class Accounts:
    def __init__(self, store: AccountStore) -> None:
        self.store = store
        self._hasher = PasswordHasher()
        self._hashing = threading.BoundedSemaphore(HASHING_AT_ONCE)
        self._decoy: str | None = None  # verified when a login names nobody, so both cost the same
        self._users_exist = False  # once seen, kept: a stale True asks for a login, never the reverse

    # --- users ----------------------------------------------------------------
    def has_users(self) -> bool:
        if not self._users_exist:
            self._users_exist = self.store.has_users()
        return self._users_exist

    def _hash(self, password: str) -> str:
        with self._hashing:
            return self._hasher.hash(check_password(password))

    def add_user(self, name: str, password: str, *, admin: bool = False) -> UserRecord:
        """The first user is an admin and takes over the chats made before accounts existed."""
        user = self.store.add_user(check_name(name), self._hash(password), admin=admin)
        self._users_exist = True
        note(self.store.db, "user.add", f"{user.name}{' (admin)' if user.admin else ''}")
        return user

    def set_password(self, name: str, password: str, *, keep_keys: bool = False) -> int:
        """Also ends every login session of that user and, unless `keep_keys`, revokes their API keys (a password
        is changed after a compromise, and a key made by whoever knew it must not outlive it); the keys revoked."""
        revoked = self.store.set_password(check_name(name), self._hash(password), revoke_keys=not keep_keys)
        note(self.store.db, "user.password", f"{check_name(name)} ({revoked} API key(s) revoked)")
        return revoked

    def remove_user(self, name: str) -> int:
        """Remove a user, their chats, keys and sessions; the number of chats removed."""
        removed = self.store.remove_user(check_name(name))
        self._users_exist = self.store.has_users()
        note(self.store.db, "user.remove", f"{check_name(name)} ({removed} chat(s))")
        return removed

    def users(self) -> list[UserRecord]:
        return self.store.users()

    def approve(self, name: str) -> UserRecord:
        """Let a user made at a first sign-in, waiting for an admin (SERGE_NEW_USERS_PENDING), use Serge."""
        approved = self.store.approve(check_name(name))
        note(self.store.db, "user.approve", approved.name)
        return approved

    def user(self, name: str) -> UserRecord:
        return self.store.user(check_name(name))

    def authenticate(self, name: str, password: str) -> UserRecord:
        try:
            found = self.store.credentials(check_name(name))
            password.encode()
        except (InvalidAccountInput, UnicodeEncodeError):
            found, password = None, ""
        if found is None and self._decoy is None:
            self._decoy = self._hash(secrets.token_urlsafe(16))
        with self._hashing:
            try:
                ok = self._hasher.verify(found[1] if found else self._decoy, password)
            except (VerificationError, InvalidHashError):
                ok = False
        if found is None or not ok:
            raise LoginFailed("wrong name or password")
        return found[0]

    # --- API keys -------------------------------------------------------------
    def create_key(self, user: UserRecord, name: str | None = None) -> tuple[KeyRecord, str]:
        """A new key for `user`: its record, and the key itself, which is never shown again."""
        name = " ".join((name or "").split()) or "key"
        if len(name) > MAX_KEY_NAME_CHARS:
            raise InvalidAccountInput(f"a key's name is at most {MAX_KEY_NAME_CHARS} characters", "name")
        try:
            name.encode()
        except UnicodeEncodeError:
            raise InvalidAccountInput("the key's name holds characters that are not valid Unicode text",
                                      "name") from None
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        return self.store.add_key(user.id, name, key[: len(KEY_PREFIX) + KEY_SHOWN_CHARS], digest(key)), key

    def keys(self, user: UserRecord) -> list[KeyRecord]:
        return self.store.keys(user.id)

    def revoke_key(self, user: UserRecord, ref: str) -> KeyRecord:
        """Revoke one of `user`'s keys by its id or its visible prefix."""
        return self.store.revoke_key(user.id, ref.strip())

    def user_for_key(self, key: str) -> tuple[UserRecord, str] | None:
        """The owner of an active key and the key's id (for logs), or None for a revoked, unknown or malformed one."""
        if not key.startswith(KEY_PREFIX) or len(key) > 200 or not key.isascii():
            return None
        return self.store.user_for_key(digest(key))
