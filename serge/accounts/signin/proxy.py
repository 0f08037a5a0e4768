"""Sign-in by a trusted proxy's header (oauth2-proxy's `X-Forwarded-Email`, Authelia's `Remote-User`).

A proxy in front of Serge signs people in and names each request's person in a header. That header is
believed only on a connection from an address the admin named (SERGE_PROXY_USER_FROM, matched as uvicorn
matches SERGE_TRUSTED_PROXIES: addresses and networks); from anyone else it is ignored, as if absent.
A person is made an account at their first request, found after by the header's value (never by a
user name, so the proxy's "root" is not the local account root). Nothing here reads HTTP itself.
"""

from __future__ import annotations

from uvicorn.middleware.proxy_headers import _TrustedHosts

from serge.accounts.signin.provision import user_names
from serge.accounts.service import InvalidAccountInput
from serge.settings import check_addresses
from serge.store.people.sign_ins import ExternalUser, SignInStore
from serge.store.people.accounts import UserRecord

SOURCE = "proxy"
MAX_VALUE_CHARS = 320


class ProxySignIn:
    def __init__(self, header: str, addresses: str, store: SignInStore) -> None:
        self.header = header.lower()
        self._trusted = _TrustedHosts(check_addresses(addresses))
        self.store = store

    def believes(self, peer: str | None) -> bool:
        """Whether a connection from `peer` (the connection's own address, never a forwarded one) is the proxy's."""
        return peer is not None and peer in self._trusted

    def user(self, value: str) -> UserRecord:
        """The account of the person the proxy named (made at their first request)."""
        value = value.strip()
        if not value or len(value) > MAX_VALUE_CHARS or not value.isprintable():
            raise InvalidAccountInput(f"the proxy's {self.header} header names nobody Serge can use "
                                      f"(1-{MAX_VALUE_CHARS} printable characters)", self.header)
        external = f"{SOURCE}:{value.lower()}"
        if found := self.store.find(external):
            return found
        email = value if "@" in value else None
        return self.store.provision(ExternalUser(source=SOURCE, external_id=external,
                                                 names=user_names(value.partition("@")[0], external),
                                                 email=email, admin=None))
