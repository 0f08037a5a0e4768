"""Sign-in with an OpenID Connect provider, for the browser: the button's start and the provider's callback;
and the login form's second try, with the directory's (LDAP) password.

`/auth/oidc/start` sends the browser to the provider and binds the sign-in to that browser with a
short-lived cookie holding its state; `/auth/oidc/callback` accepts the provider's answer only in the
browser that started it (so a callback link someone else sends cannot sign you in as them), then
starts the same login session a password does. A refusal is the login page with what went wrong and
a 4xx (a 502 when the provider failed). The flow's rules live in `serge.accounts.signin.oidc`; HTTP only.
"""

from __future__ import annotations

import hmac
import logging
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse
from fastapi.templating import Jinja2Templates

from serge import __version__
from serge.accounts import LoginFailed
from serge.accounts.signin.oidc import PENDING_LIFETIME, OpenIdSignIn, SignInFailed
from serge.store import UserRecord
from serge.web.http.auth import SESSION_COOKIE
from serge.web.http.errors import ApiError
from serge.web.http.context import context as request_context, services

TEMPLATES = Path(__file__).parent.parent / "templates"
START = "/auth/oidc/start"
CALLBACK = "/auth/oidc/callback"
SIGN_IN_COOKIE = "serge_sign_in"

log = logging.getLogger(__name__)
router = APIRouter(include_in_schema=False)
templates = Jinja2Templates(directory=str(TEMPLATES))


def safe_next(target: str | None) -> str:
    """Only a path on this server: never another host (`//evil.example`, `/\\evil.example`)."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")) or "\n" in target \
            or "\r" in target or len(target) > 2000:
        return "/"
    return target


def public_base(request: Request) -> str:
    """The URL Serge is reached at: SERGE_PUBLIC_URL, else the one this browser used (its Host passed the guard)."""
    configured = request.app.state.settings.public_url
    return (configured or str(request.base_url)).rstrip("/")


def _oidc(request: Request) -> OpenIdSignIn:
    found = services(request).oidc
    if found is None:
        raise ApiError(404, "sign-in with OpenID Connect is not set up here (SERGE_OIDC_ISSUER)", code="not_found")
    return found


def _refused(request: Request, exc: SignInFailed):
    log.warning("sign-in with OpenID Connect refused: %s", exc)
    response = templates.TemplateResponse(request, "login.html", {
        "user": None, "local": False, "version": __version__, "next": "/", "name": "",
        "error": f"Sign-in failed: {exc}", "sign_in_with": _oidc(request).provider_name,
    }, status_code=exc.status)
    response.delete_cookie(SIGN_IN_COOKIE, path="/auth/oidc")
    return response


def start_session(request: Request, user: UserRecord, target: str) -> RedirectResponse:
    """Signed in: a login session's cookie, and the browser sent on to `target` (a path of this server)."""
    sessions = services(request).sessions
    response = RedirectResponse(safe_next(target), status_code=303)
    response.set_cookie(SESSION_COOKIE, sessions.start(user), max_age=int(sessions.lifetime.total_seconds()),
                        path="/", httponly=True, samesite="lax", secure=request.url.scheme == "https")
    return response


def directory_login(request: Request, name: str, password: str) -> UserRecord | None:
    """The account of the person the directory (LDAP) signs in with this password, their groups set from it; None
    when no directory is set or it refuses. Raises DirectoryUnavailable when it cannot be asked."""
    ldap = services(request).ldap
    if ldap is None:
        return None
    try:
        found = ldap.authenticate(name, password)
    except LoginFailed:
        return None
    user = services(request).sign_ins.provision(found.user)
    if found.groups is not None:
        services(request).groups.sync(user.id, "ldap", found.groups)
    log.info("signed in with LDAP: user %s (%s)", user.name, user.id)
    return user


def provider_logout(request: Request):
    """After Serge's session ended: for someone who signed in with the provider, a page that sends the browser on
    to end the provider's session too (a link, and a meta refresh: the logout form's redirect could not leave
    Serge, whose pages allow forms to go to Serge only); None for everyone else."""
    user, oidc = request_context(request).user, services(request).oidc
    if oidc is None or user is None or user.signed_in_by != "oidc":
        return None
    ending = oidc.logout_url(public_base(request) + "/login")
    if ending is None:
        return None
    return templates.TemplateResponse(request, "signed_out.html", {
        "user": None, "local": False, "version": __version__, "ending": ending, "provider": oidc.provider_name})


@router.get(START)
def start(request: Request, next: str | None = None):
    oidc = _oidc(request)
    try:
        url, state = oidc.begin(public_base(request) + CALLBACK, safe_next(next))
    except SignInFailed as exc:
        return _refused(request, exc)
    response = RedirectResponse(url, status_code=303)
    # lax: sent on the provider's top-level redirect back here, never on another site's request
    response.set_cookie(SIGN_IN_COOKIE, state, max_age=int(PENDING_LIFETIME.total_seconds()), path="/auth/oidc",
                        httponly=True, samesite="lax", secure=request.url.scheme == "https")
    return response


@router.get(CALLBACK)
def callback(request: Request, state: str = "", code: str | None = None, error: str | None = None,
             error_description: str | None = None, iss: str | None = None):
    oidc = _oidc(request)
    bound = request.cookies.get(SIGN_IN_COOKIE, "")
    if not state or len(state) > 200 or not hmac.compare_digest(bound.encode(), state.encode()):
        return _refused(request, SignInFailed("this answer is not for a sign-in started in this browser (its state "
                                              "does not match); start again from the login page"))
    try:
        found, target = oidc.finish(state, code, error=error, description=error_description, iss=iss)
    except SignInFailed as exc:
        return _refused(request, exc)
    user = services(request).sign_ins.provision(found.user)
    if found.groups is not None:  # the provider's groups claim decides their groups of the provider's
        services(request).groups.sync(user.id, "oidc", found.groups)
    services(request).grants.keep(user.id, found.refresh_token)  # for the sign-in sync to ask about them later
    log.info("signed in with OpenID Connect: user %s (%s)", user.name, user.id)
    response = start_session(request, user, target)
    response.delete_cookie(SIGN_IN_COOKIE, path="/auth/oidc")
    return response
