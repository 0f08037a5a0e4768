"""The account pages: log in and out, your API keys, and (for admins) the users.

Server-rendered forms that work without script. A new API key is shown once,
on the page that answers its creation, and never again. Failed logins are
metered per account name and per client address and, for a request a proxy
relayed, per proxy connection too (a header that names a new address each time
does not reset the count), so guessing passwords (and the CPU argon2 costs)
stays slow; a login that succeeds costs nothing. The rules themselves live in `serge.accounts`; this is HTTP only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from serge import __version__
from serge.accounts import LOCAL_USER, Accounts, InvalidAccountInput, LoginFailed, LoginSessions
from serge.store import KeyNotFound, LastAdmin, NameTaken, UserNotFound
from serge.web.http.auth import SESSION_COOKIE, current_user, peer
from serge.web.http.limits.user_limits import UserLimits
from serge.accounts.signin.ldap import DirectoryUnavailable
from serge.web.pages.sign_in import directory_login, provider_logout
from serge.web.pages.usage import quota_context  # the caps' forms on the Users page
from serge.web.http.context import context as request_context, services

TEMPLATES = Path(__file__).parent.parent / "templates"
log = logging.getLogger(__name__)
LOGIN_ATTEMPTS_PER_MINUTE = 10  # failed logins per account name, and per client address
LOGIN_ATTEMPTS_PER_PROXY_MINUTE = 30  # failed logins relayed by one proxy, whatever addresses it forwards

Text = Annotated[str, Form(max_length=2048)]


def safe_next(target: str | None) -> str:
    """Only a path on this server: never another host (`//evil.example`, `/\\evil.example`)."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")) or "\n" in target:
        return "/"
    return target


def login_buckets(request: Request, name: str) -> list[tuple[str, int]]:
    """The budgets a login attempt spends: (key, attempts per minute)."""
    client = request.client.host if request.client else "unknown"
    buckets = [(f"login-name:{name.strip().lower()[:64]}", LOGIN_ATTEMPTS_PER_MINUTE),
               (f"login:{client}", LOGIN_ATTEMPTS_PER_MINUTE)]
    if (via := peer(request)) != client:  # relayed: the proxy's connection is counted as well
        buckets.append((f"login-peer:{via}", LOGIN_ATTEMPTS_PER_PROXY_MINUTE))
    return buckets


def build_account_pages(limits: UserLimits) -> APIRouter:
    router = APIRouter(include_in_schema=False)
    templates = Jinja2Templates(directory=str(TEMPLATES))

    def accounts(request: Request) -> Accounts:
        return services(request).accounts

    def sessions(request: Request) -> LoginSessions:
        return services(request).sessions

    def render(request: Request, template: str, status_code: int = 200, headers: dict | None = None, **context):
        user = request_context(request).user
        return templates.TemplateResponse(request, template, {
            "user": user, "local": user is LOCAL_USER, "version": __version__,
            "sign_in_with": oidc.provider_name if (oidc := services(request).oidc) else None,
            **context,
        }, status_code=status_code, headers=headers)

    # --- login ----------------------------------------------------------------
    @router.get("/login")
    def login_page(request: Request, next: str | None = None):
        if not accounts(request).has_users() and services(request).oidc is None and services(request).ldap is None:
            return RedirectResponse("/", status_code=303)
        return render(request, "login.html", next=safe_next(next), name="", error=None)

    @router.post("/login")
    def login(request: Request, name: Text = "", password: Text = "", next: Text = "/"):
        buckets = login_buckets(request, name)
        wait = max(limits.take(key, rate) for key, rate in buckets)  # each is spent, so none can be walked alone
        if wait:
            return render(request, "login.html", 429, {"Retry-After": str(wait)}, next=safe_next(next), name=name,
                          error=f"Too many attempts; try again in {wait} s.")
        try:
            user = accounts(request).authenticate(name, password)
        except LoginFailed:
            try:
                user = directory_login(request, name, password)  # the directory's password, where one is set
            except DirectoryUnavailable as exc:
                log.error("LDAP sign-in: %s", exc)
                return render(request, "login.html", 503, next=safe_next(next), name=name,
                              error="The directory that checks passwords cannot be reached; try again soon.")
            if user is None:
                return render(request, "login.html", 401, next=safe_next(next), name=name,
                              error="Wrong name or password.")
        for key, rate in buckets:  # only failed attempts are metered
            limits.refund(key, rate)
        response = RedirectResponse(safe_next(next), status_code=303)
        response.set_cookie(
            SESSION_COOKIE, sessions(request).start(user), max_age=int(sessions(request).lifetime.total_seconds()),
            path="/", httponly=True, samesite="lax", secure=request.url.scheme == "https",
        )
        return response

    @router.post("/logout")
    def logout(request: Request):
        if cookie := request.cookies.get(SESSION_COOKIE):
            sessions(request).end(cookie)
        # and, for someone who signed in with the provider, on to end its session where it offers to
        response = provider_logout(request) or RedirectResponse("/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="lax",
                               secure=request.url.scheme == "https")
        return response

    # --- your API keys --------------------------------------------------------
    def settings_page(request: Request, status_code: int = 200, **context):
        user = current_user(request)
        keys = [] if user is LOCAL_USER else accounts(request).keys(user)
        return render(request, "settings.html", status_code, keys=keys, **context)

    @router.get("/settings")
    def your_settings(request: Request):
        return settings_page(request)

    @router.post("/settings/keys")
    def create_key(request: Request, name: Text = ""):
        user = current_user(request)
        if user is LOCAL_USER:
            return settings_page(request, 400, error="API keys belong to accounts; create the first account first.")
        try:
            record, key = accounts(request).create_key(user, name)
        except InvalidAccountInput as exc:
            return settings_page(request, 400, error=str(exc))
        return settings_page(request, 201, new_key=key, new_record=record)

    @router.post("/settings/keys/{key_id}/revoke")
    def revoke_key(key_id: str, request: Request):
        try:
            accounts(request).revoke_key(current_user(request), key_id)
        except KeyNotFound as exc:
            return settings_page(request, 404, error=str(exc))
        return RedirectResponse("/settings", status_code=303)

    # --- users (admins) -------------------------------------------------------
    def users_page(request: Request, status_code: int = 200, **context) -> Response:
        if not current_user(request).admin:
            return render(request, "users.html", 403, forbidden=True, users=[])
        return render(request, "users.html", status_code, users=accounts(request).users(), **quota_context(request),
                      **context)

    @router.get("/admin/users")
    def users(request: Request):
        return users_page(request)

    @router.post("/admin/users")
    def add_user(request: Request, name: Text = "", password: Text = "", admin: Text = ""):
        if not current_user(request).admin:
            return users_page(request)
        try:
            added = accounts(request).add_user(name, password, admin=bool(admin))
        except (InvalidAccountInput, NameTaken) as exc:
            return users_page(request, 400, error=str(exc), name=name)
        return users_page(request, 201, added=added)

    def changing_user(request: Request, change: Callable[[], Response],
                      refusals: Mapping[type[Exception], int]) -> Response:
        """An admin's change to a user; refused, the users page says why, with the refusal's status."""
        if not current_user(request).admin:
            return users_page(request)
        try:
            return change()
        except tuple(refusals) as exc:
            return users_page(request, next(s for t, s in refusals.items() if isinstance(exc, t)), error=str(exc))

    @router.post("/admin/users/{name}/password")
    def set_password(name: str, request: Request, password: Text = "", keep_keys: Text = ""):
        def change() -> Response:
            revoked = accounts(request).set_password(name, password, keep_keys=bool(keep_keys))
            keys = "their API keys were kept" if keep_keys else f"{revoked} API key(s) of theirs were revoked"
            return users_page(request, changed=f"Changed the password of {name}; their logins have ended and {keys}.")
        return changing_user(request, change, {InvalidAccountInput: 400, UserNotFound: 404})

    @router.post("/admin/users/{name}/approve")
    def approve_user(name: str, request: Request):
        def change() -> Response:
            approved = accounts(request).approve(name)
            return users_page(request, changed=f"Approved {approved.name}: they may use Serge now.")
        return changing_user(request, change, {InvalidAccountInput: 404, UserNotFound: 404})

    @router.post("/admin/users/{name}/remove")
    def remove_user(name: str, request: Request):
        def change() -> Response:
            accounts(request).remove_user(name)
            return RedirectResponse("/admin/users", status_code=303)
        return changing_user(request, change, {InvalidAccountInput: 404, UserNotFound: 404, LastAdmin: 409})

    return router
