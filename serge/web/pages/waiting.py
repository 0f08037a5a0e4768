"""What a user waiting for an admin's approval gets (SERGE_NEW_USERS_PENDING): a page that says so for a
browser, a 403 `pending_approval` for a program; they may still reach /api/me and log out. HTTP only."""

from __future__ import annotations

from pathlib import Path

from fastapi.responses import JSONResponse
from fastapi.templating import Jinja2Templates
from starlette.requests import Request

from serge import __version__
from serge.store import UserRecord
from serge.web.http.errors import error_body

TEMPLATES = Jinja2Templates(directory=str(Path(__file__).parent.parent / "templates"))
MESSAGE = ("your account waits for an admin's approval (made at your first sign-in); an admin approves it on the "
           "Users page or with `serge users approve NAME`")


async def waiting(scope, receive, send, user: UserRecord) -> None:
    request = Request(scope)
    if request.method in ("GET", "HEAD") and "text/html" in request.headers.get("accept", "") \
            and not scope["path"].startswith(("/api/", "/v1/")):
        response = TEMPLATES.TemplateResponse(request, "waiting.html", {
            "user": user, "local": False, "version": __version__}, status_code=403)
    else:
        response = JSONResponse(error_body(MESSAGE, status=403, code="pending_approval", scope=scope), status_code=403)
    await response(scope, receive, send)
