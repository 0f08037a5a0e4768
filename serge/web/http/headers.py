"""Security headers on every response: pages, API, static files, errors.

The policy lets a page run only Serge's own script files (no inline script, no eval), load
images only from Serge or data: URLs (so model output can never make the browser fetch a
remote address carrying a chat's text), and never be framed. A response that sets its own
Content-Security-Policy (the /docs page) keeps it. An unexpected exception still answers in the
JSON error shape with these headers, and is logged by the server as before.

It decides nothing about who may call (guard.py does).
"""

from __future__ import annotations

import json

from serge.web.http.errors import error_body
from serge.web.http.asgi import HttpMiddleware

POLICY = "; ".join([
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data:",
    "connect-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
])

HEADERS = (
    (b"content-security-policy", POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    # same-origin, not no-referrer: under no-referrer a browser sends `Origin: null` on the page's own
    # beacon and form POSTs, which the guard must then refuse.
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
)


def with_security_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    present = {name.lower() for name, _ in headers}
    return [*headers, *((name, value) for name, value in HEADERS if name not in present)]


class SecurityHeaders(HttpMiddleware):
    async def http(self, scope, receive, send):
        started = False

        async def send_with_headers(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message = {**message, "headers": with_security_headers(list(message.get("headers", [])))}
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        except Exception:
            if not started:
                await _server_error(send_with_headers, scope)
            raise  # the server logs it; nothing more is sent


async def _server_error(send, scope) -> None:
    body = json.dumps(error_body("the server failed on this request; it is logged, and it is a bug in Serge",
                                 status=500, code="internal_error", scope=scope)).encode()
    await send({"type": "http.response.start", "status": 500,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
