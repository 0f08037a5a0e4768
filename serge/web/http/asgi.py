"""What Serge's pure ASGI middlewares share: each handles HTTP requests and lets anything else (the lifespan
events) through untouched.

A middleware subclasses `HttpMiddleware` and writes `http(scope, receive, send)`; it knows nothing here of
what any of them checks or adds.
"""

from __future__ import annotations


class HttpMiddleware:
    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        return await self.http(scope, receive, send)

    async def http(self, scope, receive, send):
        """This middleware's work on one HTTP request."""
        raise NotImplementedError
