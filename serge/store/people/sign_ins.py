"""Sign-ins through an identity provider: the ones on their way, and the accounts they end in.

A sign-in sent to the provider is a row keyed by its state's hash, taken (read and deleted in one
transaction) when the provider sends the browser back, so a state answers once, in whichever process
the callback reaches. A user from a provider is found by their `external_id` (the provider and its
subject), never by a name: a provider's "admin" cannot become the local account named admin. It
decides nothing about claims or names (`serge.accounts.signin.provision` does). A provider's refresh token
is kept only sealed (`serge.accounts.signin.grants` seals and opens it): this store never sees one in the clear.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy.exc import IntegrityError

from serge.store.people.accounts import UserRecord
from serge.store.chats import new_id
from serge.store.db import Database
from serge.store.tables import ApiKey, LoginSession, PendingSignIn, ProviderGrant, User, now

NO_PASSWORD = "!"  # not an argon2 hash: a password never matches it


@dataclass(frozen=True)
class PendingRecord:
    nonce: str
    code_verifier: str
    redirect_uri: str
    next: str


@dataclass(frozen=True)
class ExternalUser:
    """Who a provider says signed in, as the store keeps them."""

    source: str  # "oidc"
    external_id: str
    names: tuple[str, ...]  # the user names to try, in order; the first one free is taken
    email: str | None
    admin: bool | None  # None: as an admin set it by hand
    pending: bool = False  # a new account waits for an admin's approval (SERGE_NEW_USERS_PENDING)


@dataclass(frozen=True)
class CutOff:
    """What cutting a user off ended: both 0 when it had been done before."""

    sessions: int
    keys: int

    @property
    def anything(self) -> bool:
        return bool(self.sessions or self.keys)


@dataclass(frozen=True)
class SealedGrant:
    """A provider's refresh token for one account, as kept (sealed), claimed by this process to redeem."""

    user: UserRecord
    external: str  # who they are at the source: the external id without "{source}:"
    sealed: str


class SignInStore:
    def __init__(self, db: Database, new_users_pending: bool = False) -> None:
        self.db = db
        self.new_users_pending = new_users_pending

    # --- sign-ins on their way ------------------------------------------------------
    def begin(self, state_hash: str, pending: PendingRecord, lifetime: timedelta) -> None:
        """Keep a sign-in until its callback or `lifetime`; ones past their end are cleared out on the way."""
        with self.db.session() as session, session.begin():
            stamp = now()
            session.execute(delete(PendingSignIn).where(PendingSignIn.expires_at < stamp))
            session.add(PendingSignIn(state_hash=state_hash, nonce=pending.nonce, code_verifier=pending.code_verifier,
                                      redirect_uri=pending.redirect_uri, next=pending.next,
                                      expires_at=stamp + lifetime))

    def take(self, state_hash: str) -> PendingRecord | None:
        """The sign-in sent with this state, removed so it cannot be used again; None when unknown, used or
        expired."""
        with self.db.session() as session, session.begin():
            row = session.get(PendingSignIn, state_hash)
            if row is None:
                return None
            gone = session.execute(delete(PendingSignIn).where(PendingSignIn.state_hash == state_hash)).rowcount
            if gone != 1 or row.expires_at < now():  # another process took it first, or it is too old
                return None
            return PendingRecord(row.nonce, row.code_verifier, row.redirect_uri, row.next)

    # --- the accounts they end in --------------------------------------------------
    def from_source(self, source: str) -> list[tuple[UserRecord, str]]:
        """Every account a source made, with who it is there (its external id without the source)."""
        with self.db.session() as session:
            rows = session.scalars(select(User).where(User.signed_in_by == source).order_by(User.name))
            return [(UserRecord.of(r), (r.external_id or "").removeprefix(f"{source}:")) for r in rows]

    def cut_off(self, user_id: str) -> CutOff:
        """End every login of a user and revoke their API keys (gone at their provider); what that ended, counted
        in the same transaction, so of two processes cutting one user off at once only one sees anything ended."""
        with self.db.session() as session, session.begin():
            ended = session.execute(delete(LoginSession).where(LoginSession.user_id == user_id))
            revoked = session.execute(update(ApiKey).where(ApiKey.user_id == user_id, ApiKey.revoked_at.is_(None))
                                      .values(revoked_at=now()))
            return CutOff(ended.rowcount or 0, revoked.rowcount or 0)

    # --- the providers' refresh tokens, sealed ------------------------------------------
    def keep_grant(self, user_id: str, sealed: str | None) -> None:
        """Keep a user's newest sealed refresh token in place of any before (None: they have none any more)."""
        with self.db.session() as session, session.begin():
            session.execute(delete(ProviderGrant).where(ProviderGrant.user_id == user_id))
            if sealed is not None:
                session.add(ProviderGrant(user_id=user_id, sealed=sealed, kept_at=now()))

    def claim_grants(self, source: str, checked_before: datetime, lease: timedelta) -> Iterator[SealedGrant]:
        """The grants of `source`'s accounts not checked since `checked_before` and not being redeemed elsewhere,
        each claimed for `lease` by a conditional update just before it is handed out, so no two processes redeem
        one token at once (a provider that rotates refresh tokens takes a second use of one as a theft and
        revokes the grant). Stop iterating and the rest stay unclaimed."""
        with self.db.session() as session:
            candidates = session.scalars(select(ProviderGrant.user_id).join(User, User.id == ProviderGrant.user_id)
                                         .where(User.signed_in_by == source).order_by(User.name)).all()
        for user_id in candidates:
            with self.db.session() as session, session.begin():
                stamp = now()
                free = or_(ProviderGrant.redeeming_until.is_(None), ProviderGrant.redeeming_until < stamp)
                due = or_(ProviderGrant.checked_at.is_(None), ProviderGrant.checked_at < checked_before)
                taken = session.execute(update(ProviderGrant).where(and_(ProviderGrant.user_id == user_id, free, due))
                                        .values(redeeming_until=stamp + lease)).rowcount
                user, grant = (session.get(User, user_id), session.get(ProviderGrant, user_id)) if taken == 1 else \
                    (None, None)
                claimed = SealedGrant(UserRecord.of(user), (user.external_id or "").removeprefix(f"{source}:"),
                                      grant.sealed) if user is not None and grant is not None else None
            if claimed is not None:
                yield claimed

    def redeemed(self, user_id: str, sealed: str | None) -> None:
        """A claimed grant was redeemed: keep the token the provider gave in exchange (None: drop it)."""
        with self.db.session() as session, session.begin():
            if sealed is None:
                session.execute(delete(ProviderGrant).where(ProviderGrant.user_id == user_id))
            else:
                session.execute(update(ProviderGrant).where(ProviderGrant.user_id == user_id)
                                .values(sealed=sealed, checked_at=now(), redeeming_until=None))

    def release_grant(self, user_id: str) -> None:
        """A claimed grant could not be redeemed (the provider was not reached): free for the next round."""
        with self.db.session() as session, session.begin():
            session.execute(update(ProviderGrant).where(ProviderGrant.user_id == user_id)
                            .values(redeeming_until=None))

    def find(self, external_id: str) -> UserRecord | None:
        with self.db.session() as session:
            row = session.scalar(select(User).where(User.external_id == external_id))
            return UserRecord.of(row) if row else None

    def provision(self, user: ExternalUser) -> UserRecord:
        """The account of this provider's user, made at their first sign-in (pending, when new users wait for an
        admin), its email (and admin flag, when the provider says) brought up to date at each one."""
        user = replace(user, pending=self.new_users_pending)
        for _ in range(3):  # two first sign-ins of one user at once: the second finds the first's row
            try:
                return self._provision(user)
            except IntegrityError:
                continue
        raise RuntimeError(f"could not make an account for {user.external_id!r}")

    def _provision(self, user: ExternalUser) -> UserRecord:
        with self.db.session() as session, session.begin():
            row = session.scalar(select(User).where(User.external_id == user.external_id))
            if row is None:
                taken = set(session.scalars(select(User.name).where(User.name.in_(user.names))))
                name = next(n for n in user.names if n not in taken)
                row = User(id=new_id(), name=name, password_hash=NO_PASSWORD, admin=bool(user.admin),
                           created_at=now(), signed_in_by=user.source, external_id=user.external_id,
                           email=user.email, pending=user.pending and not user.admin)
                session.add(row)
                session.flush()
            else:
                row.email = user.email
                if user.admin is not None and user.admin != row.admin:
                    admins = session.scalar(select(func.count()).select_from(User).where(User.admin))
                    if user.admin or admins > 1:  # the last admin stays one: someone must manage the users
                        row.admin = user.admin
            return UserRecord.of(row)
