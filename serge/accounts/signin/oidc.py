"""Sign-in with an OpenID Connect provider: the authorization code flow with PKCE, through Authlib.

`begin` finds the provider's endpoints by discovery (`{issuer}/.well-known/openid-configuration`,
whose `issuer` must be the configured one), and keeps the sign-in (state, nonce, PKCE verifier,
redirect URI, where to go after) in the database for ten minutes. `finish` takes it back once by its
state, exchanges the code with the verifier, and has Authlib check the ID token against the provider's
JWKS: its signature (an asymmetric algorithm the provider announces: never `none`, never a shared-secret
HMAC), issuer, audience (this client), expiry, and the nonce sent. The claims then name the account
(`provision.identity`). Anything wrong is a `SignInFailed` that says what, and nothing is provisioned.
Where the discovery lists `offline_access`, it is asked for too (with `prompt=consent`, as OpenID Connect Core
section 11 wants), and the refresh token the provider gives
comes with the identity: `redeem` later exchanges it at the token endpoint, so the sign-in sync learns
whether the person may still sign in (`invalid_grant`: they may not) without them coming back.
It knows nothing about cookies, pages or HTTP routes; the provider is reached with httpx.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from datetime import timedelta
from urllib.parse import urlencode

import httpx
from authlib.integrations.base_client import BaseApp, FrameworkIntegration, OAuthError
from authlib.integrations.base_client.sync_app import OAuth2Mixin
from authlib.integrations.base_client.sync_openid import OpenIDMixin
from authlib.integrations.httpx_client import OAuth2Client
from joserfc.errors import ClaimError, ExpiredTokenError, JoseError

from serge.accounts.signin.provision import ClaimNames, Identity, identity
from serge.store.people.sign_ins import PendingRecord, SignInStore

PENDING_LIFETIME = timedelta(minutes=10)  # from the button to the provider's answer
LEEWAY_S = 60  # clocks of Serge and the provider may differ this much
PROVIDER_TIMEOUT_S = 10.0
SOURCE = "oidc"
OFFLINE = "offline_access"


def _provider_errors() -> tuple[type[Exception], ...]:
    """What reaching the provider can raise: Authlib's client runs on httpx2 where it is installed (mcp and
    huggingface_hub bring it), else on httpx; a body that is not JSON is a ValueError."""
    errors: list[type[Exception]] = [httpx.HTTPError, ValueError]
    try:
        import httpx2
    except ImportError:
        pass
    else:
        errors.append(httpx2.HTTPError)
    return tuple(errors)


PROVIDER_ERRORS = _provider_errors()


class GrantRefused(Exception):
    """The provider refused a refresh token (`invalid_grant`): the account was removed or disabled there, or the
    grant revoked. The message says what the provider said."""


@dataclass(frozen=True)
class Renewed:
    """What a redeemed refresh token brought: the token to keep in its place, and the groups claim of the fresh
    ID token (None when no ID token or no groups claim came back)."""

    refresh_token: str = field(repr=False)
    groups: tuple[str, ...] | None


class SignInFailed(Exception):
    """A sign-in refused; the message says why, for the person and the admin. `status`: 400 when the answer
    was wrong, 502 when the provider could not be reached or answered nonsense."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class OidcConfig:
    issuer: str
    client_id: str
    client_secret: str | None
    scopes: str
    provider_name: str
    claims: ClaimNames


class _Client(OAuth2Mixin, OpenIDMixin, BaseApp):
    """Authlib's own OAuth 2.0 + OpenID client over httpx (what its Flask and Starlette apps are, without their
    cookie-session storage: Serge keeps a sign-in in its database)."""

    client_cls = OAuth2Client


def digest(state: str) -> str:
    return hashlib.sha256(state.encode()).hexdigest()


def _why(exc: JoseError) -> str:
    if isinstance(exc, ExpiredTokenError):
        return "it has expired (exp)"
    if isinstance(exc, ClaimError):
        claim = getattr(exc, "claim", "") or str(exc)
        what = {"iss": "it was issued by another issuer", "aud": "it was issued to another client",
                "nonce": "its nonce is not the one this sign-in sent (a replayed token?)",
                "azp": "it was issued to another client"}.get(claim, f"its claim {claim!r} is wrong or missing")
        return f"{what} ({claim})"
    return f"{exc.error}: {exc.description or 'its signature does not verify with the provider’s keys'}"


class OpenIdSignIn:
    def __init__(self, config: OidcConfig, store: SignInStore) -> None:
        self.config = config
        self.store = store
        # a refresh asks for no scope: it keeps the grant's own
        self._token_kwargs = {"timeout": PROVIDER_TIMEOUT_S,
                              "token_endpoint_auth_method": "client_secret_basic" if config.client_secret else "none"}
        self._client = _Client(
            FrameworkIntegration(SOURCE), name=SOURCE, client_id=config.client_id,
            client_secret=config.client_secret,
            server_metadata_url=config.issuer.rstrip("/") + "/.well-known/openid-configuration",
            client_kwargs={"scope": config.scopes, "code_challenge_method": "S256", **self._token_kwargs})

    @property
    def provider_name(self) -> str:
        return self.config.provider_name

    def _metadata(self) -> dict:
        try:
            metadata = self._client.load_server_metadata()
        except PROVIDER_ERRORS as exc:
            self._client.server_metadata.pop("_loaded_at", None)
            raise SignInFailed(f"could not read the provider's discovery document at {self._client._server_metadata_url}"
                               f" ({type(exc).__name__}: {exc}); is SERGE_OIDC_ISSUER right?", 502) from None
        if metadata.get("issuer") != self.config.issuer:
            self._client.server_metadata.pop("_loaded_at", None)
            raise SignInFailed(f"the provider calls itself {metadata.get('issuer')!r}, not {self.config.issuer!r}; "
                               "set SERGE_OIDC_ISSUER to its issuer exactly", 502)
        # only asymmetric signatures verify against the JWKS: 'none' and HMAC (a shared secret) are never accepted
        announced = metadata.get("id_token_signing_alg_values_supported") or ["RS256"]
        metadata["id_token_signing_alg_values_supported"] = [
            a for a in announced if isinstance(a, str) and a != "none" and not a.startswith("HS")]
        return metadata

    def begin(self, redirect_uri: str, next_path: str) -> tuple[str, str]:
        """The provider's URL to send the browser to, and the sign-in's state; kept until its callback."""
        scopes = self.config.scopes.split()
        if OFFLINE in (self._metadata().get("scopes_supported") or []) and OFFLINE not in scopes:
            scopes.append(OFFLINE)  # a refresh token, for the sync to ask about them later
        extra = {"prompt": "consent"} if OFFLINE in scopes else {}  # OpenID Connect Core 11: asked with consent
        started = self._client.create_authorization_url(redirect_uri, scope=" ".join(scopes), **extra)
        self.store.begin(digest(started["state"]), PendingRecord(started["nonce"], started["code_verifier"],
                                                                 redirect_uri, next_path), PENDING_LIFETIME)
        return started["url"], started["state"]

    def finish(self, state: str, code: str | None, *, error: str | None = None, description: str | None = None,
               iss: str | None = None) -> tuple[Identity, str]:
        """Who signed in, and the path to go to; the sign-in's state is used up whatever the outcome."""
        pending = self.store.take(digest(state)) if state else None
        if pending is None:
            raise SignInFailed("this sign-in is unknown, already used, or older than 10 minutes; start it again")
        if error:
            raise SignInFailed(f"{self.provider_name} did not sign you in: {error[:100]}"
                               + (f" ({description[:300]})" if description else ""))
        if iss is not None and iss != self.config.issuer:  # RFC 9207: an answer from another provider
            raise SignInFailed(f"the answer names the issuer {iss[:200]!r}, not {self.config.issuer!r}")
        if not code:
            raise SignInFailed("the provider's answer carries no code")
        metadata = self._metadata()
        try:
            token = self._client.fetch_access_token(redirect_uri=pending.redirect_uri, code=code,
                                                    code_verifier=pending.code_verifier)
        except OAuthError as exc:
            raise SignInFailed(f"the provider refused the code: {exc.error}"
                               + (f" ({exc.description})" if exc.description else "")) from None
        except PROVIDER_ERRORS as exc:
            raise SignInFailed(f"could not exchange the code at the provider ({type(exc).__name__}: {exc})", 502) \
                from None
        if not token.get("id_token"):
            raise SignInFailed("the provider sent no ID token; is 'openid' among SERGE_OIDC_SCOPES?", 502)
        claims = self._checked_claims(token, pending.nonce)
        found = dict(claims)
        if metadata.get("userinfo_endpoint") and token.get("access_token"):
            found = {**self._userinfo(token, claims["sub"]), **found}  # the signed token's claims win
        person = identity(SOURCE, f"{self.config.issuer}#{claims['sub']}", found, self.config.claims)
        refresh = token.get("refresh_token")
        return replace(person, refresh_token=refresh if isinstance(refresh, str) and refresh else None), pending.next

    def _checked_claims(self, token: dict, nonce: str | None):
        options = {"iss": {"essential": True, "value": self.config.issuer},
                   "aud": {"essential": True, "value": self.config.client_id}}
        try:
            return self._client.parse_id_token(token, nonce=nonce, claims_options=options, leeway=LEEWAY_S)
        except JoseError as exc:
            raise SignInFailed(f"the provider's ID token was refused: {_why(exc)}") from None
        except PROVIDER_ERRORS as exc:
            raise SignInFailed(f"could not check the ID token ({type(exc).__name__}: {exc})", 502) from None

    def redeem(self, refresh_token: str, subject: str) -> Renewed:
        """Exchange a refresh token of the person `subject` (`{issuer}#{sub}`) at the token endpoint. Raises
        GrantRefused when the provider answers `invalid_grant`, SignInFailed (502) when it cannot be reached, answers
        5xx or anything else, or sends an ID token that does not check out or is about someone else."""
        metadata = self._metadata()
        try:
            with OAuth2Client(self.config.client_id, self.config.client_secret, **self._token_kwargs) as session:
                token = session.refresh_token(metadata["token_endpoint"], refresh_token=refresh_token)
        except OAuthError as exc:
            said = exc.error + (f" ({exc.description})" if exc.description else "")
            if exc.error == "invalid_grant":
                raise GrantRefused(said) from None
            raise SignInFailed(f"the provider did not renew the grant: {said}", 502) from None
        except (*PROVIDER_ERRORS, KeyError) as exc:
            raise SignInFailed(f"could not renew a grant at the provider ({type(exc).__name__}: {exc})", 502) \
                from None
        groups = None
        if token.get("id_token"):
            claims = self._checked_claims(token, None)  # a refreshed ID token carries no nonce of this sign-in
            if f"{self.config.issuer}#{claims['sub']}" != subject:
                raise SignInFailed("the renewed ID token is about someone else", 502)
            groups = identity(SOURCE, subject, dict(claims), self.config.claims).groups
        renewed = token.get("refresh_token")
        return Renewed(renewed if isinstance(renewed, str) and renewed else refresh_token, groups)

    def _userinfo(self, token: dict, subject: str) -> dict:
        """The provider's userinfo (some put groups only there); ignored unless it is about the same subject."""
        try:
            info = dict(self._client.userinfo(token=token))
        except (*PROVIDER_ERRORS, OAuthError):
            return {}
        return info if info.get("sub") == subject else {}

    def logout_url(self, post_logout_redirect_uri: str) -> str | None:
        """Where the browser ends its session at the provider (RP-initiated logout), or None when it offers none."""
        try:
            endpoint = self._metadata().get("end_session_endpoint")
        except SignInFailed:
            return None
        if not isinstance(endpoint, str) or not endpoint.startswith(("https://", "http://")):
            return None
        query = urlencode({"client_id": self.config.client_id, "post_logout_redirect_uri": post_logout_redirect_uri})
        return f"{endpoint}{'&' if '?' in endpoint else '?'}{query}"


def open_id_sign_in(settings, store: SignInStore) -> OpenIdSignIn | None:
    """The provider's sign-in as the settings describe it (`serge.settings.Settings`), or None when none is set."""
    if not settings.oidc_issuer:
        return None
    secret = settings.oidc_client_secret
    secret = secret.get_secret_value() if hasattr(secret, "get_secret_value") else secret  # model_copy keeps a str
    claims = ClaimNames(name=settings.oidc_name_claim, email=settings.oidc_email_claim,
                        groups=settings.oidc_groups_claim, admin=settings.oidc_admin_claim,
                        admin_value=settings.oidc_admin_value)
    return OpenIdSignIn(OidcConfig(settings.oidc_issuer, settings.oidc_client_id, secret, settings.oidc_scopes,
                                   settings.oidc_provider_name, claims), store)
