"""Who is asking: every request is resolved to a user before any route runs, and metered.

A request proves who it is with the cookie of a login session or, on the API, with
a key (`Authorization: Bearer sk-serge-...`, or `x-api-key: sk-serge-...` as Anthropic's
clients send it). While Serge has no accounts, requests
made on this machine are the local user, as before accounts existed, and others
are refused. Once any account exists, everything but the login page, static
files, the health status and the metrics (whose routes decide what to show)
needs one of the two: a page sends the browser to /login, anything else gets
401. A user's requests other than model requests are metered here per process
(SERGE_USER_REQUESTS_PER_MINUTE, a flood guard); model requests are counted by
their quota, in the database (`UsageMeter`). What a user may see is not decided here: routes pass the user's id to
the chat service as the owner of every query, and the models, presets and tool servers shared only with groups
the user is not in are hidden for the request (`serge.access`). Everything the engine does for the
request counts as that user's (or, without accounts, the client address's) in its
fair share (`party`).
"""

from __future__ import annotations

import ipaddress
from urllib.parse import quote

import anyio
from fastapi import Depends, Request
from fastapi.responses import JSONResponse, RedirectResponse
from starlette.concurrency import run_in_threadpool

from serge.accounts import LOCAL_USER, Accounts, InvalidAccountInput, LoginSessions
from serge.access import acting, hiding
from serge.engine.sharing.party import asking
from serge.store import DatabaseUnavailable, UserRecord
from serge.web.http.context import context, context_of, services
from serge.web.http.errors import ApiError, error_body, problem
from serge.web.http.limits.user_limits import UserLimits

SESSION_COOKIE = "serge_session"
OPEN_PATHS = frozenset({"/login", "/api/health", "/metrics", "/auth/oidc/start", "/auth/oidc/callback"})
WAITING_MAY = OPEN_PATHS | {"/api/me", "/logout"}  # all a user waiting for an admin's approval may reach
STATIC_PREFIX = "/static/"
API_PREFIXES = ("/api/", "/v1/", "/metrics", "/openapi.json", "/mcp")
FORWARDING_HEADERS = frozenset({b"forwarded", b"x-forwarded-for", b"x-forwarded-proto", b"x-forwarded-host",
                                b"x-forwarded-port", b"x-forwarded-server", b"x-real-ip", b"x-client-ip",
                                b"true-client-ip", b"cf-connecting-ip", b"x-cluster-client-ip", b"fastly-client-ip"})
STREAM_RETRY_S = 5  # a reply's end cannot be known ahead; a short wait, then try again


def is_local(scope) -> bool:
    """Made on this machine and not relayed by a proxy (a local reverse proxy sends these headers)."""
    client = scope.get("client")
    if not client:
        return False
    try:
        address = ipaddress.ip_address(client[0])
    except ValueError:
        return False
    address = getattr(address, "ipv4_mapped", None) or address
    return address.is_loopback and not any(name in FORWARDING_HEADERS for name, _ in scope["headers"])


def party(user: UserRecord | None, scope) -> str:
    """Who a request is to the engine, which shares its slots fairly between parties: the user, or (no
    accounts: everyone is the local user) the client's address."""
    if user is not None and user is not LOCAL_USER:
        return f"user {user.id}"
    client = scope.get("client")
    return f"address {client[0] if client else 'unknown'}"


def peer(request: Request) -> str:
    """The address the connection itself came from (a proxy's, when one relayed the request)."""
    found = context(request).peer
    return found or (request.client.host if request.client else "unknown")


class ProxiedClient:
    """Pure ASGI, outermost: a trusted proxy's X-Forwarded-For and -Proto are believed (uvicorn's own rules,
    SERGE_TRUSTED_PROXIES), and the connection's own address is kept as the request's `peer`, so a limit
    can count on an address no header can change. `serge serve` runs uvicorn without its proxy handling."""

    def __init__(self, app, trusted_proxies: str) -> None:
        from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

        self.app = app
        self._believe = ProxyHeadersMiddleware(app, trusted_proxies)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            client = scope.get("client")
            context_of(scope).peer = client[0] if client else None
        await self._believe(scope, receive, send)


def current_user(request: Request) -> UserRecord:
    user = context(request).user
    if user is None:
        raise ApiError(401, "log in first", code="unauthorized")
    return user


def admins_only(what: str):
    """A route's dependency: anyone but an admin gets a 403 saying who may `what`, before the body is checked."""
    def check(request: Request) -> None:
        if not current_user(request).admin:
            raise ApiError(403, f"only an admin may {what}", code="forbidden")
    return Depends(check)


def owner(request: Request) -> str:
    """Every query is scoped by owner: the signed-in user, or "local" while Serge has no accounts."""
    return current_user(request).id


def may_see_details(request: Request) -> bool:
    """Admins and requests made on this machine see paths, devices and metrics."""
    user = context(request).user
    return bool(user and user.admin) or is_local(request.scope)


def api_key(request: Request) -> str:
    """The key a request carries: `Authorization: Bearer ...` (OpenAI's clients), else `x-api-key` (Anthropic's)."""
    scheme, _, credential = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and credential.strip():
        return credential.strip()
    return request.headers.get("x-api-key", "").strip()


def _resolve(accounts: Accounts, sessions: LoginSessions, request: Request
             ) -> tuple[UserRecord | None, str | None, bool, bool]:
    """(the user or None, the id of the key used, whether a key was sent and refused, whether accounts exist)."""
    accounts_exist = accounts.has_users()
    credential = api_key(request)
    if credential and request.scope["path"].startswith(API_PREFIXES):
        if found := accounts.user_for_key(credential):
            return found[0], found[1], False, True
        if accounts_exist:  # with no accounts, clients may send anything ("unused")
            return None, None, True, True
    proxy = services(request).proxy_sign_in  # a trusted proxy's header names the person (accounts/proxy.py)
    if proxy is not None and (named := request.headers.get(proxy.header)) is not None \
            and proxy.believes(context(request).peer):
        return proxy.user(named), None, False, True
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie and (user := sessions.user(cookie)):
        return user, None, False, True
    if not accounts_exist and is_local(request.scope):
        return LOCAL_USER, None, False, False
    return None, None, False, accounts_exist


class Authenticate:
    """Pure ASGI (not BaseHTTPMiddleware), so streamed replies and disconnects pass straight through."""

    def __init__(self, app, limits: UserLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"].startswith(STATIC_PREFIX):
            return await self.app(scope, receive, send)
        request = Request(scope)
        path = scope["path"]
        state = services(request)
        try:
            user, key_id, bad_key, accounts_exist = await run_in_threadpool(_resolve, state.accounts, state.sessions,
                                                                             request)
        except InvalidAccountInput as exc:  # the proxy's header names nobody Serge can use
            return await self._refuse(scope, receive, send, 400, str(exc), "invalid_proxy_user")
        if bad_key:
            return await self._refuse(scope, receive, send, 401, "the API key is not valid (revoked or mistyped); "
                                      "create one on the settings page or with `serge keys create`", "invalid_api_key")
        if user is None and path not in OPEN_PATHS:
            if not accounts_exist and state.oidc is None and state.ldap is None:  # else: signing in makes one
                return await self._refuse(scope, receive, send, 403, "Serge has no accounts yet, so it answers only "
                                          "requests made on this machine; create one with `serge users add NAME`",
                                          "no_accounts")
            if request.method in ("GET", "HEAD") and "text/html" in request.headers.get("accept", "") \
                    and not path.startswith(API_PREFIXES):
                target = path + (f"?{scope['query_string'].decode('latin-1')}" if scope["query_string"] else "")
                response = RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)
                return await response(scope, receive, send)
            return await self._refuse(scope, receive, send, 401, "log in first: on the page at /login, or from a "
                                      "program with an API key as `Authorization: Bearer sk-serge-...` or "
                                      "`x-api-key: sk-serge-...`",
                                      "unauthorized", {"WWW-Authenticate": 'Bearer realm="serge"'})
        if user is not None and user.pending and not user.admin and path not in WAITING_MAY:
            from serge.web.pages.waiting import waiting  # an account made at a first sign-in, not yet approved

            return await waiting(scope, receive, send, user)
        noted = context_of(scope)
        noted.user, noted.key_id = user, key_id
        hidden = {} if user is None or user is LOCAL_USER or user.admin else \
            await run_in_threadpool(state.groups.hidden_from, user)  # shared only with groups they are not in
        with asking(party(user, scope)), hiding(hidden), acting(user.name if user is not None else "anonymous"):
            if user is None or user is LOCAL_USER or path in OPEN_PATHS:
                return await self.app(scope, receive, send)
            return await self._metered(user, scope, receive, send)

    async def _metered(self, user: UserRecord, scope, receive, send):
        kind = context_of(scope).kind  # what the route's router declares it to be
        model_request = kind is not None and kind.model
        wait = 0 if model_request else self.limits.take(user.id)  # a model request's minute is the quota's (UsageMeter)
        if wait:
            return await self._refuse(scope, receive, send, 429, f"more than {self.limits.per_minute} requests "
                                      f"other than model requests in a minute on this server "
                                      f"(SERGE_USER_REQUESTS_PER_MINUTE); retry in {wait} s", "rate_limited",
                                      {"Retry-After": str(wait)})
        streaming = kind is not None and kind.streaming
        stream = None
        if streaming:
            try:
                stream = (await run_in_threadpool(self.limits.open_stream, user.id)
                          if self.limits.streams_in_database else self.limits.open_stream(user.id))
            except DatabaseUnavailable as exc:  # the streams are counted in the database: it must answer
                answer = problem(exc)
                return await self._refuse(scope, receive, send, answer.status, answer.message, answer.code,
                                          answer.headers)
        if streaming and stream is None:
            return await self._refuse(scope, receive, send, 429, f"you already have {self.limits.max_streams} "
                                      "replies in progress, the most one user may run at once "
                                      "(SERGE_USER_MAX_STREAMS); wait for one to finish", "too_many_streams",
                                      {"Retry-After": str(STREAM_RETRY_S)})
        try:
            await self.app(scope, receive, send)
        finally:
            if stream is not None:
                if self.limits.streams_in_database:
                    with anyio.CancelScope(shield=True):  # a cancelled request still gives its stream back
                        await run_in_threadpool(self.limits.close_stream, stream)
                else:
                    self.limits.close_stream(stream)

    @staticmethod
    async def _refuse(scope, receive, send, status: int, message: str, code: str,
                      headers: dict[str, str] | None = None) -> None:
        response = JSONResponse(error_body(message, status=status, code=code, scope=scope), status_code=status,
                                headers=headers)
        await response(scope, receive, send)
