"""The refresh tokens identity providers give Serge, kept sealed: encrypted and authenticated with Fernet
(`cryptography`), under a key derived (HKDF) from the data dir's secret, so a copy of the database alone
does not hold a single usable token. A token that no longer opens (the secret was replaced) counts as none.
Nothing here talks to a provider or decides who is cut off (`sync` does); the store keeps what it seals.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from serge.store.people.accounts import UserRecord
from serge.store.people.sign_ins import SignInStore

PURPOSE = b"serge: identity providers' refresh tokens"


def sealing_key(secret: bytes) -> bytes:
    """A Fernet key of its own for refresh tokens, from Serge's secret (which also signs sessions)."""
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=PURPOSE).derive(secret)
    return base64.urlsafe_b64encode(derived)


@dataclass(frozen=True)
class Grant:
    user: UserRecord
    external: str  # who they are at the provider: its external id without the source
    refresh_token: str | None = field(repr=False)  # None: it no longer opens (Serge's secret was replaced)


class ProviderGrants:
    def __init__(self, store: SignInStore, secret: bytes) -> None:
        self.store = store
        self._fernet = Fernet(sealing_key(secret))

    def keep(self, user_id: str, refresh_token: str | None) -> None:
        """Keep what a sign-in brought: its refresh token, or none (then one kept before goes too: it belongs to
        an older grant the newest sign-in did not renew)."""
        self.store.keep_grant(user_id, self._seal(refresh_token))

    def due(self, source: str, checked_before: datetime, lease: timedelta) -> Iterator[Grant]:
        """The grants of `source` to check now (not checked since `checked_before`), each claimed by this process
        for `lease` as it is handed out."""
        for sealed in self.store.claim_grants(source, checked_before, lease):
            yield Grant(sealed.user, sealed.external, self._open(sealed.sealed))

    def renewed(self, user_id: str, refresh_token: str | None) -> None:
        """The provider answered: keep the token it gave in exchange (None: the grant is over, drop it)."""
        self.store.redeemed(user_id, self._seal(refresh_token))

    def unanswered(self, user_id: str) -> None:
        self.store.release_grant(user_id)

    def _seal(self, token: str | None) -> str | None:
        return self._fernet.encrypt(token.encode()).decode() if token else None

    def _open(self, sealed: str) -> str | None:
        try:
            return self._fernet.decrypt(sealed.encode()).decode()
        except InvalidToken:
            return None
