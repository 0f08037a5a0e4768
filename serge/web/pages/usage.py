"""The admin's Usage page (tokens per day as a chart, per user, per key, per model) and the caps' forms.

Server-rendered, without script: the chart is SVG drawn by `usage_chart`. The caps are set from the
Users page's forms (a user's own, the account-wide default). A plain user gets 403. HTTP only: the
numbers come from `serge.accounts.Usage`.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from serge import __version__
from serge.accounts import LOCAL_USER, InvalidAccountInput
from serge.accounts.usage_report import usage_filter, usage_rows
from serge.store import QuotaRecord, UserNotFound
from serge.web.http.auth import current_user
from serge.web.pages.usage_chart import tokens_chart
from serge.web.http.context import services

TEMPLATES = Path(__file__).parent.parent / "templates"
DEFAULT_DAYS = 30
Cap = Annotated[str, Form(max_length=20)]


def _cap(text: str, field: str) -> int | None:
    text = text.strip().replace(",", "").replace("_", "")
    if not text:
        return None
    if not text.isdigit():
        raise InvalidAccountInput(f"{field.replace('_', ' ')}: give a whole number, or leave it empty for no cap",
                                  field)
    return int(text)


def _quota(tokens_per_day: str, tokens_per_month: str, requests_per_minute: str) -> QuotaRecord:
    return QuotaRecord(_cap(tokens_per_day, "tokens_per_day"), _cap(tokens_per_month, "tokens_per_month"),
                       _cap(requests_per_minute, "requests_per_minute"))


def quota_context(request: Request) -> dict:
    """What the Users page shows of the caps: each user's own (by id) and the account-wide default."""
    usage = services(request).usage
    return {"quotas": usage.user_quotas(), "default_quota": usage.default_quota()}


def build_usage_pages() -> APIRouter:
    router = APIRouter(include_in_schema=False)
    templates = Jinja2Templates(directory=str(TEMPLATES))

    @router.get("/admin/usage")
    def usage_page(request: Request, days: int = Query(DEFAULT_DAYS, ge=1, le=366)) -> Response:
        user = current_user(request)
        context = {"user": user, "local": user is LOCAL_USER, "version": __version__}
        if not user.admin:
            return templates.TemplateResponse(request, "usage.html", {**context, "forbidden": True}, status_code=403)
        usage, accounts = services(request).usage, services(request).accounts
        today = usage.clock().date()
        only = usage_filter(accounts, start=today - timedelta(days=days - 1), end=today)
        tables = {by: usage_rows(usage, accounts, by, only) for by in ("user", "key", "model")}
        chart = tokens_chart(usage_rows(usage, accounts, "day", only), f"Tokens per day (UTC), last {days} days")
        return templates.TemplateResponse(request, "usage.html", {**context, "chart": chart, "tables": tables,
                                                                  "days": days, "today": today})

    @router.post("/admin/users/{name}/quota")
    def set_user_quota(name: str, request: Request, tokens_per_day: Cap = "", tokens_per_month: Cap = "",
                       requests_per_minute: Cap = ""):
        return _set(request, name, tokens_per_day, tokens_per_month, requests_per_minute)

    @router.post("/admin/quotas/default")
    def set_default_quota(request: Request, tokens_per_day: Cap = "", tokens_per_month: Cap = "",
                          requests_per_minute: Cap = ""):
        return _set(request, None, tokens_per_day, tokens_per_month, requests_per_minute)

    def _set(request: Request, name: str | None, *caps: str):
        if not current_user(request).admin:
            return RedirectResponse("/admin/users", status_code=303)  # the Users page says who may
        usage = services(request).usage
        try:
            quota = _quota(*caps)
            if name is None:
                usage.set_default_quota(quota)
            else:
                usage.set_user_quota(services(request).accounts.user(name).id, quota)
        except (InvalidAccountInput, UserNotFound) as exc:
            accounts = services(request).accounts
            return templates.TemplateResponse(request, "users.html", {
                "user": current_user(request), "local": False, "version": __version__, "users": accounts.users(),
                "error": str(exc),
                **quota_context(request)}, status_code=400 if isinstance(exc, InvalidAccountInput) else 404)
        return RedirectResponse("/admin/users", status_code=303)

    return router
