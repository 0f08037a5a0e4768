"""Keeps web pages the user visits from driving Serge through their browser.

Any page can make the browser send requests to 127.0.0.1. Before any route runs:
- DNS rebinding: a name the attacker controls, pointed at this machine, arrives with its own
  `Host` header. Only IP addresses, localhost, the address Serge listens on and the names in
  SERGE_ALLOWED_HOSTS are answered (421 otherwise); an IP address cannot be rebound.
- Cross-site writes: a POST, PUT, PATCH or DELETE whose `Origin` is not this server's own (same
  scheme, host and port; nor one in SERGE_CORS_ORIGINS), or that the browser marks
  `Sec-Fetch-Site: cross-site`/`same-site` (whatever its Origin says, unless that is a CORS origin),
  is refused (403). The JSON APIs take only application/json bodies (415 otherwise), which no page
  can send to another origin without a CORS preflight, and CORS is off unless configured (Ollama's
  routes read a `curl -d` form as JSON too, but only from a caller that sends neither header). Together
  these stand in for a CSRF token: the page's own forms are sent by its script as JSON.
Requests with neither header (curl, SDKs, scripts) are not a browser acting for a page and pass.

It does not say who the caller is (accounts do that) and reads no body (bodies.py does).
`protect()` installs it with the security headers, CORS when configured, and the body check.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from fastapi import FastAPI
from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse

from serge.documents import MAX_FILE_BYTES
from serge.settings import Settings
from serge.web.http.errors import error_body
from serge.web.http.headers import SecurityHeaders
from serge.web.http.any_body import reads_any_body_as_json
from serge.web.http.bodies import JSON_APIS, UPLOAD_OVERHEAD_BYTES, BodyCheck, is_json, is_upload

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
DEFAULT_PORTS = {"http": 80, "https": 443}
LOOPBACK_NAMES = frozenset({"localhost"})

_HOST = re.compile(r"(?P<name>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::(?P<port>\d{1,5}))?")


def split_host(value: str) -> tuple[str, int | None] | None:
    """(name, port) of a Host header or an origin's authority; None when it is not one."""
    match = _HOST.fullmatch(value)
    if not match:
        return None
    name = match["name"].lower().removeprefix("[").removesuffix("]").rstrip(".")
    return name, int(match["port"]) if match["port"] else None


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Refusal:
    status: int
    message: str
    code: str

    def response(self, scope) -> JSONResponse:
        return JSONResponse(error_body(self.message, status=self.status, code=self.code, scope=scope),
                            status_code=self.status)


@dataclass(frozen=True)
class HostPolicy:
    """Which hosts Serge answers to and which other origins may call it, decided once from the settings."""

    names: frozenset[str]
    any_host: bool
    cors_origins: frozenset[str]

    @classmethod
    def of(cls, settings: Settings) -> HostPolicy:
        bind = settings.host.strip().lower().removeprefix("[").removesuffix("]")
        names = set(LOOPBACK_NAMES) | set(settings.allowed_hosts) | {bind}
        return cls(frozenset(names - {"*"}), "*" in settings.allowed_hosts, frozenset(settings.cors_origins))

    def serves(self, name: str) -> bool:
        return self.any_host or name in self.names or _is_address(name)

    def check(self, method: str, path: str, headers: Headers, scheme: str = "http",
              any_body: bool = False, upload: bool = False) -> Refusal | None:
        """Why this request is refused, or None when it may go on; `scheme` is the one the request came by;
        `any_body`: its route reads this body as JSON whatever its type (any_body.py); `upload`: a file sent to a
        route that takes one."""
        host = headers.get("host")
        place = split_host(host) if host is not None else None
        if host is not None and place is None:
            return Refusal(400, f"the Host header {host[:100]!r} is not a host name", "invalid_host")
        if place is not None and not self.serves(place[0]):
            return Refusal(421, f"this server does not answer to the host {place[0][:100]!r}; if Serge should be "
                                "reached under this name, add it to SERGE_ALLOWED_HOSTS", "host_not_allowed")
        if method not in STATE_CHANGING:
            return None
        origin = headers.get("origin")
        if origin is not None and not self._trusted(origin, place, scheme):
            hint = ""
            if self._trusted(origin, place, "https" if scheme == "http" else "http"):
                hint = (f"; this request came by {scheme}: behind a TLS proxy, have it send X-Forwarded-Proto "
                        "(from an address in SERGE_TRUSTED_PROXIES)")
            return Refusal(403, f"refused a cross-origin {method} from {origin[:100]!r}: pages on other sites may not "
                                f"change anything here (SERGE_CORS_ORIGINS lists origins that may){hint}",
                           "cross_origin")
        site = headers.get("sec-fetch-site", "").lower()
        cors = origin is not None and origin.lower().rstrip("/") in self.cors_origins
        if site in ("cross-site", "same-site") and not cors:
            return Refusal(403, f"refused a {site} {method}: pages on other sites may not change anything here",
                           "cross_origin")
        content_type = headers.get("content-type")
        if (path.startswith(JSON_APIS) and content_type is not None and not is_json(content_type)
                and not upload and not any_body):
            return Refusal(415, f"this API reads JSON, not {content_type.split(';')[0][:100]!r}; "
                                "send application/json", "unsupported_media_type")
        return None

    def _trusted(self, origin: str, place: tuple[str, int | None] | None, scheme: str) -> bool:
        """The page's own origin (same scheme, host and port as the request), or one configured for CORS."""
        if origin.lower().rstrip("/") in self.cors_origins:
            return True
        try:
            parts = urlsplit(origin)
        except ValueError:  # "http://[" and the like: not an origin, so not this server's
            return False
        source = split_host(parts.netloc) if parts.scheme in DEFAULT_PORTS and not parts.path else None
        if source is None or place is None or parts.scheme != scheme:
            return False
        default = DEFAULT_PORTS[parts.scheme]
        return source[0] == place[0] and (source[1] or default) == (place[1] or default)


class Guard:
    """Pure ASGI: the checks above, before routing; nothing else is touched."""

    def __init__(self, app, policy: HostPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            refusal = self.policy.check(scope["method"], scope["path"], headers, scope.get("scheme", "http"),
                                        reads_any_body_as_json(scope, headers),
                                        is_upload(scope, headers.get("content-type")))
            if refusal is not None:
                return await refusal.response(scope)(scope, receive, send)
        await self.app(scope, receive, send)


def protect(app: FastAPI, settings: Settings) -> None:
    """Install, outermost first: security headers, CORS (only when configured), the guard, the body check."""
    app.add_middleware(BodyCheck, max_bytes=settings.max_request_bytes,
                       max_upload_bytes=MAX_FILE_BYTES + UPLOAD_OVERHEAD_BYTES)
    app.add_middleware(Guard, policy=HostPolicy.of(settings))
    if settings.cors_origins:  # API keys, not the browser's cookies, cross origins
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["*"],
                           allow_headers=["Authorization", "Content-Type", "x-api-key", "anthropic-version",
                                          "anthropic-beta"], allow_credentials=False)
    app.add_middleware(SecurityHeaders)
