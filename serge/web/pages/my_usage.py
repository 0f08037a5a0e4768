"""The "My usage" page, for every user: their tokens and requests today and this month against their caps,
in plain words, with when each count starts again. Server-rendered, no script; the same numbers are at
`GET /api/usage/mine`. Everyone's usage is the admin's Usage page (pages/usage.py), not this one.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from fastapi.templating import Jinja2Templates
from starlette.concurrency import run_in_threadpool

from serge import __version__
from serge.accounts import LOCAL_USER
from serge.accounts.my_usage import my_usage
from serge.web.http.auth import current_user
from serge.web.http.context import services
from serge.web.pages.usage import TEMPLATES

router = APIRouter(include_in_schema=False)
templates = Jinja2Templates(directory=str(TEMPLATES))


@router.get("/usage")
async def my_usage_page(request: Request) -> Response:
    user = current_user(request)
    mine = await run_in_threadpool(my_usage, services(request).usage, user.id, user is not LOCAL_USER)
    return templates.TemplateResponse(request, "my_usage.html", {
        "user": user, "local": user is LOCAL_USER, "version": __version__, "mine": mine})
