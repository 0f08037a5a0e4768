"""The sign-in sync: asking the identity providers whether the people they signed in may still sign in, and
cutting off those who may not (their logins end, their API keys are revoked, the audit log says why).

LDAP: every account the directory made is looked up by its entry (`still_there`). OpenID Connect: every
refresh token kept at a sign-in (`grants`) is redeemed at the provider; `invalid_grant` (the account removed
or disabled there, or the grant revoked) cuts the person off and drops the token, a renewal keeps the new
token and sets their provider groups from the fresh ID token. A provider that cannot be asked, or answers
anything else, changes nothing: the round skips that provider and the next one asks again, logged when it
goes down and when it is back, not at every round.

Each process that serves may run it (`SyncLoop`): the directory lookups only read, a cut-off ends each
login and key once (the store counts what it ended, so only one process notes it), and a refresh token is
claimed in the database before it is redeemed, so two processes never redeem one token. Knows no HTTP;
`serge users sync` and `serge serve` (every SERGE_SIGN_IN_SYNC_S) run the same `SignInSync.run`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from serge.accounts.groups import Groups
from serge.accounts.signin.grants import ProviderGrants
from serge.accounts.signin.ldap import SOURCE as LDAP, DirectoryUnavailable, LdapSignIn
from serge.accounts.signin.oidc import PROVIDER_TIMEOUT_S, SOURCE as OIDC, GrantRefused, OpenIdSignIn, SignInFailed
from serge.store.db import Database
from serge.store.people.accounts import UserRecord
from serge.store.people.audit import note
from serge.store.people.sign_ins import CutOff, SignInStore
from serge.store.tables import now

REDEEM_LEASE = timedelta(seconds=6 * PROVIDER_TIMEOUT_S)  # one redeem: discovery, token endpoint, keys, at most

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Gone:
    """Someone a provider no longer signs in, and what cutting them off ended."""

    user: UserRecord
    why: str  # "gone from the directory (uid=cy,...)", "refused by the provider (invalid_grant ...)"
    ended: CutOff


@dataclass(frozen=True)
class SyncReport:
    asked: int  # the accounts asked about
    gone: tuple[Gone, ...]
    unreachable: tuple[str, ...]  # each provider that could not be asked, and why


class SignInSync:
    def __init__(self, sign_ins: SignInStore, groups: Groups, database: Database, grants: ProviderGrants,
                 ldap: LdapSignIn | None, oidc: OpenIdSignIn | None) -> None:
        self.sign_ins = sign_ins
        self.groups = groups
        self.database = database
        self.grants = grants
        self.ldap = ldap
        self.oidc = oidc
        self._down: set[str] = set()  # the providers found unreachable at the last round: logged once

    @property
    def has_providers(self) -> bool:
        return self.ldap is not None or self.oidc is not None

    def run(self, checked_before: datetime | None = None, stopping: Callable[[], bool] = lambda: False
            ) -> SyncReport:
        """Ask each provider about its accounts; a refresh token redeemed since `checked_before` is not redeemed
        again (default: now, i.e. every one not being redeemed by another process this moment)."""
        asked, gone, unreachable = 0, [], []
        askers = [(LDAP, self._ask_directory)] if self.ldap is not None else []
        askers += [(OIDC, self._ask_provider)] if self.oidc is not None else []
        for source, ask in askers:
            try:
                asked += ask(gone, checked_before or now(), stopping)
            except (DirectoryUnavailable, SignInFailed) as exc:
                unreachable.append(f"{source}: {exc}")
                if source not in self._down:
                    log.warning("sign-in sync: could not ask %s (%s); nobody was cut off, asking again next round",
                                source, exc)
                self._down.add(source)
            else:
                if source in self._down:
                    log.info("sign-in sync: %s answers again", source)
                self._down.discard(source)
        return SyncReport(asked, tuple(gone), tuple(unreachable))

    def _ask_directory(self, gone: list[Gone], _checked_before: datetime, stopping: Callable[[], bool]) -> int:
        made = self.sign_ins.from_source(LDAP)
        for user, dn in made:
            if stopping():
                break
            if not self.ldap.still_there(dn):
                gone.append(self._cut_off(user, f"gone from the directory ({dn})", noted_anyway=False))
        return len(made)

    def _ask_provider(self, gone: list[Gone], checked_before: datetime, stopping: Callable[[], bool]) -> int:
        asked = 0
        for grant in self.grants.due(OIDC, checked_before, REDEEM_LEASE):
            asked += 1
            if grant.refresh_token is None:  # sealed under a secret since replaced: nothing to ask with
                self.grants.renewed(grant.user.id, None)
                continue
            try:
                renewed = self.oidc.redeem(grant.refresh_token, grant.external)
            except GrantRefused as exc:
                self.grants.renewed(grant.user.id, None)
                gone.append(self._cut_off(grant.user, f"refused by the provider ({exc})", noted_anyway=True))
            except SignInFailed:
                self.grants.unanswered(grant.user.id)
                raise  # the rest wait for the next round
            else:
                self.grants.renewed(grant.user.id, renewed.refresh_token)
                if renewed.groups is not None:
                    self.groups.sync(grant.user.id, OIDC, renewed.groups)
            if stopping():
                break
        return asked

    def _cut_off(self, user: UserRecord, why: str, *, noted_anyway: bool) -> Gone:
        """End their logins and keys; noted in the audit log when that ended anything (a directory entry stays
        gone round after round) or `noted_anyway` (a provider's refusal is heard once: its token is dropped)."""
        ended = self.sign_ins.cut_off(user.id)
        if ended.anything or noted_anyway:
            note(self.database, "user.cut_off", f"{user.name} ({why}; {ended.sessions} login(s) ended, "
                                                f"{ended.keys} API key(s) revoked)")
            log.info("sign-in sync: cut off %s (%s): %d login(s) ended, %d API key(s) revoked", user.name, why,
                     ended.sessions, ended.keys)
        return Gone(user, why, ended)


class SyncLoop:
    """`SignInSync.run` every `interval_s` on one thread of its own, from a server's start until `close`."""

    def __init__(self, sync: SignInSync, interval_s: float) -> None:
        self.sync = sync
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._rounds, name="serge-sign-in-sync", daemon=True)

    def start(self) -> SyncLoop:
        self._thread.start()
        return self

    def _rounds(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:  # a token redeemed by another process in this interval is not redeemed again
                self.sync.run(now() - timedelta(seconds=0.9 * self.interval_s), self._stop.is_set)
            except Exception:  # a round that failed is tried again at the next; the loop goes on
                log.exception("sign-in sync: a round failed")

    def close(self) -> None:
        """Stop after the account being asked about now, and wait for it."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
