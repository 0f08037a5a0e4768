"""Login sessions: the secret that signs their cookies, and the cookies themselves.

A cookie is a random token and its HMAC-SHA256 under the secret; the database
keeps only the token's hash, so logging out or changing a password ends a
session at once, and a copy of the database cannot be turned into a login. The
secret is made at first start and kept in the data dir (mode 0600); there is no
default. Nothing here knows about HTTP.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from datetime import timedelta
from pathlib import Path

from serge.accounts.service import digest
from serge.store import AccountStore, UserRecord

SECRET_FILE = "secret.key"
MIN_SECRET_CHARS = 32


def load_secret(data_dir: Path) -> bytes:
    """The data dir's secret, made on first use; readable by its owner only."""
    path = data_dir / SECRET_FILE
    if not data_dir.exists():
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)  # the owner's alone, as the database's (store.db)
    if not path.exists():
        draft = data_dir / f".{SECRET_FILE}.{os.getpid()}"
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(48) + "\n")
        try:
            os.link(draft, path)  # atomic: two processes starting at once keep the same secret
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    if path.stat().st_mode & 0o077:
        path.chmod(0o600)
    secret = path.read_text().strip()
    if len(secret) < MIN_SECRET_CHARS:
        raise ValueError(f"{path} holds no usable secret; remove it and Serge makes a new one at start "
                         "(everyone will have to log in again)")
    return secret.encode()


class LoginSessions:
    def __init__(self, store: AccountStore, secret: bytes, lifetime: timedelta) -> None:
        self.store = store
        self.lifetime = lifetime
        self._secret = secret

    def _signature(self, token: str) -> str:
        mac = hmac.new(self._secret, token.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()

    def _token(self, cookie: str) -> str | None:
        token, _, signature = cookie.rpartition(".")
        if not token or len(cookie) > 200 or not cookie.isascii():
            return None
        return token if hmac.compare_digest(signature, self._signature(token)) else None

    def start(self, user: UserRecord) -> str:
        """A new session for `user`: the cookie's value."""
        token = secrets.token_urlsafe(32)
        self.store.add_session(digest(token), user.id, self.lifetime)
        return f"{token}.{self._signature(token)}"

    def user(self, cookie: str) -> UserRecord | None:
        """Whose session the cookie is, or None for a forged, ended or expired one."""
        token = self._token(cookie)
        return self.store.user_for_session(digest(token)) if token else None

    def end(self, cookie: str) -> None:
        if token := self._token(cookie):
            self.store.end_session(digest(token))
