"""Sign-in with a directory's password (LDAP bind, through ldap3), and the person's groups from the directory.

A login name is first held to Serge's own rule for names (lowercase letters, digits, '.', '_', '-'), so
`*)(uid=*` never reaches the directory; it is also escaped in every filter it enters. Serge finds the
person's entry with its search account (or anonymously), by SERGE_LDAP_USER_FILTER under
SERGE_LDAP_USER_BASE: exactly one entry, else the login fails. Then it binds as that entry with the
password given (an empty password is refused before: an LDAP bind without one succeeds as nobody),
and reads the email and the groups whose member is that entry. Any failure is `LoginFailed`, saying no
more than a wrong password does; a directory that cannot be reached is `DirectoryUnavailable`.
Nothing here knows about HTTP.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ldap3 import BASE, NONE, SUBTREE, Connection, Server
from ldap3.core.exceptions import (LDAPBindError, LDAPException, LDAPInvalidCredentialsResult,
                                   LDAPNoSuchObjectResult, LDAPSocketOpenError)
from ldap3.utils.conv import escape_filter_chars

from serge.accounts.signin.provision import Identity, groups_of, user_names
from serge.accounts.service import InvalidAccountInput, LoginFailed, check_name
from serge.store.people.sign_ins import ExternalUser

SOURCE = "ldap"
TIMEOUT_S = 10
MAX_PASSWORD_CHARS = 1024

log = logging.getLogger(__name__)


class DirectoryUnavailable(Exception):
    """The directory could not be reached or refused Serge's search account: an admin's problem, not the user's."""


@dataclass(frozen=True)
class LdapConfig:
    url: str
    user_base: str
    user_filter: str = "(uid={name})"
    bind_dn: str | None = None
    bind_password: str | None = None
    group_base: str | None = None
    group_filter: str = "(member={dn})"
    group_name_attribute: str = "cn"
    email_attribute: str = "mail"
    admin_group: str | None = None
    start_tls: bool = False


class LdapSignIn:
    def __init__(self, config: LdapConfig) -> None:
        self.config = config
        self._server = Server(config.url, get_info=NONE, connect_timeout=TIMEOUT_S)

    def _connect(self, user: str | None, password: str | None) -> Connection:
        connection = Connection(self._server, user=user, password=password, receive_timeout=TIMEOUT_S,
                                raise_exceptions=True, auto_bind=False)
        connection.open()
        if self.config.start_tls:
            connection.start_tls()
        connection.bind()
        return connection

    def authenticate(self, name: str, password: str) -> Identity:
        """Who the directory says `name` is, once `password` binds as them; LoginFailed otherwise."""
        try:
            name = check_name(name)
        except InvalidAccountInput:
            raise LoginFailed("wrong name or password") from None
        if not password or len(password) > MAX_PASSWORD_CHARS:
            raise LoginFailed("wrong name or password")
        entry = self._find(name)
        try:
            self._connect(entry[0], password).unbind()
        except (LDAPBindError, LDAPInvalidCredentialsResult):
            raise LoginFailed("wrong name or password") from None
        except LDAPException as exc:
            raise DirectoryUnavailable(f"the directory at {self.config.url} failed: {exc}") from None
        dn, attributes = entry
        email = _first(attributes.get(self.config.email_attribute))
        groups = self._groups(dn) if self.config.group_base else None
        admin = (self.config.admin_group in groups) if self.config.admin_group and groups is not None else None
        external = f"{SOURCE}:{dn.lower()}"
        return Identity(ExternalUser(source=SOURCE, external_id=external, names=user_names(name, external),
                                     email=email, admin=admin), groups)

    def still_there(self, dn: str) -> bool:
        """Whether the entry `dn` is still one that may sign in: present, and matching the user filter (with any
        name), so an entry removed, or disabled by a condition of the filter, is not."""
        return len(self._search(dn, self.config.user_filter.replace("{name}", "*"), [], scope=BASE)) == 1

    def _search(self, base: str, query: str, attributes: list[str], scope=SUBTREE) -> list[tuple[str, dict]]:
        try:
            connection = self._connect(self.config.bind_dn, self.config.bind_password)
        except LDAPSocketOpenError as exc:
            raise DirectoryUnavailable(f"could not reach the directory at {self.config.url}: {exc}") from None
        except LDAPException as exc:
            raise DirectoryUnavailable(f"the directory refused Serge's search account (SERGE_LDAP_BIND_DN): "
                                       f"{exc}") from None
        try:
            connection.search(base, query, scope, attributes=attributes, size_limit=1000)
            return [(e["dn"], e["attributes"]) for e in connection.response if e.get("type") == "searchResEntry"]
        except LDAPNoSuchObjectResult:  # the base is gone: nothing under it
            log.warning("LDAP: %s is not in the directory", base)
            return []
        except LDAPException as exc:
            raise DirectoryUnavailable(f"searching the directory failed: {exc}") from None
        finally:
            connection.unbind()

    def _find(self, name: str) -> tuple[str, dict]:
        query = self.config.user_filter.replace("{name}", escape_filter_chars(name))
        found = self._search(self.config.user_base, query, [self.config.email_attribute])
        if len(found) != 1:  # nobody, or a filter that names several: no guessing which
            if len(found) > 1:
                log.warning("LDAP: %d entries match %s; a login needs exactly one", len(found), query)
            raise LoginFailed("wrong name or password")
        return found[0]

    def _groups(self, dn: str) -> tuple[str, ...]:
        query = self.config.group_filter.replace("{dn}", escape_filter_chars(dn))
        found = self._search(self.config.group_base, query, [self.config.group_name_attribute])
        return groups_of([_first(a.get(self.config.group_name_attribute)) for _, a in found
                          if _first(a.get(self.config.group_name_attribute))]) or ()


def _first(value) -> str | None:
    if isinstance(value, list):
        value = value[0] if value else None
    return value.strip() if isinstance(value, str) and value.strip() else None


def ldap_sign_in(settings) -> LdapSignIn | None:
    """The directory's sign-in as the settings describe it (`serge.settings.Settings`), or None when none is set."""
    if not settings.ldap_url:
        return None
    secret = settings.ldap_bind_password
    secret = secret.get_secret_value() if hasattr(secret, "get_secret_value") else secret
    return LdapSignIn(LdapConfig(
        url=settings.ldap_url, user_base=settings.ldap_user_base, user_filter=settings.ldap_user_filter,
        bind_dn=settings.ldap_bind_dn, bind_password=secret, group_base=settings.ldap_group_base,
        group_filter=settings.ldap_group_filter, group_name_attribute=settings.ldap_group_name_attribute,
        email_attribute=settings.ldap_email_attribute, admin_group=settings.ldap_admin_group,
        start_tls=settings.ldap_start_tls))
