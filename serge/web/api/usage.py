"""The usage API: `GET /api/usage` (tokens per day, user, key, model or dialect) and the caps. HTTP only.

An admin reads anyone's usage and sets caps (the default, a user's, a key's, a group's); a plain user reads
their own (a `user` other than themselves is 403) and their own caps (`GET /api/quota`), with where each
comes from. Which cap applies is `serge.accounts.usage`'s rule. Days are UTC's.
"""

from __future__ import annotations

from datetime import date
from typing import Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from serge.accounts import LOCAL_USER, Usage
from serge.accounts.usage import MAX_QUOTA
from serge.accounts.usage_report import usage_filter, usage_rows
from serge.store import QuotaRecord
from serge.store.people.groups import GroupNotFound
from serge.web.http.auth import admins_only, current_user
from serge.web.http.context import services
from serge.web.http.errors import ApiError

router = APIRouter(tags=["usage"])
ADMIN = admins_only("set caps")


class QuotaIn(BaseModel):
    """Caps; a field left out or null is no cap of that kind (a user's: the default's applies)."""

    model_config = ConfigDict(extra="forbid")

    tokens_per_day: int | None = Field(None, ge=0, le=MAX_QUOTA, description="Prompt and generated tokens a UTC day.")
    tokens_per_month: int | None = Field(None, ge=0, le=MAX_QUOTA, description="Tokens a UTC calendar month.")
    requests_per_minute: int | None = Field(None, ge=0, le=MAX_QUOTA, description="Model requests a minute.")


def quota_out(quota: QuotaRecord | None) -> dict | None:
    return None if quota is None else {"tokens_per_day": quota.tokens_per_day,
                                       "tokens_per_month": quota.tokens_per_month,
                                       "requests_per_minute": quota.requests_per_minute}


def _usage(request: Request) -> Usage:
    return services(request).usage


@router.get("/api/usage", summary="Tokens used per day, user, key, model or dialect (admins: anyone's; others: "
                                  "their own)")
async def read_usage(request: Request,
                     user: str | None = Query(None, max_length=64, description="A user's name (admins only, "
                                                                                "or your own)."),
                     key: str | None = Query(None, max_length=32, description="An API key's id."),
                     model: str | None = Query(None, max_length=200, description="A model's name."),
                     start: date | None = Query(None, alias="from", description="The first UTC day, YYYY-MM-DD."),
                     end: date | None = Query(None, alias="to", description="The last UTC day, YYYY-MM-DD."),
                     by: Literal["day", "user", "key", "model", "dialect"] = Query("day")):
    caller = current_user(request)
    if not caller.admin:
        if user not in (None, caller.name):
            raise ApiError(403, "you may read only your own usage (leave out `user`)", code="forbidden", param="user")
        user = caller.name
    accounts = services(request).accounts

    def rows():
        only = usage_filter(accounts, user=user, key=key, model=model, start=start, end=end)
        return usage_rows(_usage(request), accounts, by, only)

    found = await run_in_threadpool(rows)
    return {"by": by, "rows": [{by: r.group, "name": r.label, "requests": r.requests,
                                "prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens,
                                "completion_tokens": r.completion_tokens, "total_tokens": r.total_tokens}
                               for r in found]}


@router.get("/api/quota", summary="Your caps as they apply, and the account-wide default")
def read_quota(request: Request):
    caller = current_user(request)
    usage = _usage(request)
    if caller is LOCAL_USER:
        return {"applied": None, "own": None, "default": quota_out(usage.default_quota())}
    quota = usage.user_quota(caller.id)
    return {"applied": quota_out(quota.applied), "own": quota_out(quota.own), "default": quota_out(quota.default),
            "sources": quota.sources}



@router.put("/api/quotas/default", dependencies=[ADMIN],
            summary="Set the caps of every user without their own (admins only)")
def set_default_quota(body: QuotaIn, request: Request):
    _usage(request).set_default_quota(QuotaRecord(body.tokens_per_day, body.tokens_per_month,
                                                  body.requests_per_minute))
    return {"default": quota_out(_usage(request).default_quota())}


@router.put("/api/users/{name}/quota", dependencies=[ADMIN],
            summary="Set a user's own caps (admins only; all null: the default's apply)")
def set_user_quota(name: str, body: QuotaIn, request: Request):
    user = services(request).accounts.user(name)
    usage = _usage(request)
    usage.set_user_quota(user.id, QuotaRecord(body.tokens_per_day, body.tokens_per_month, body.requests_per_minute))
    quota = usage.user_quota(user.id)
    return {"user": user.name, "applied": quota_out(quota.applied), "own": quota_out(quota.own)}


@router.put("/api/users/{name}/keys/{key_id}/quota", dependencies=[ADMIN],
            summary="Set one API key's caps (admins only; they apply on top of its user's)")
def set_key_quota(name: str, key_id: str, body: QuotaIn, request: Request):
    accounts = services(request).accounts
    user = accounts.user(name)
    if key_id not in {k.id for k in accounts.keys(user)}:
        raise ApiError(404, f"{user.name} has no key {key_id!r}", code="not_found", param="key_id")
    usage = _usage(request)
    usage.set_key_quota(key_id, QuotaRecord(body.tokens_per_day, body.tokens_per_month, body.requests_per_minute))
    return {"user": user.name, "key": key_id, "own": quota_out(usage.key_quota(key_id))}


@router.get("/api/groups/{name}/quota", dependencies=[ADMIN], summary="A group's caps (admins only)")
def read_group_quota(name: str, request: Request):
    group = _group(request, name)
    return {"group": group.name, "own": quota_out(_usage(request).group_quota(group.id))}


@router.put("/api/groups/{name}/quota", dependencies=[ADMIN],
            summary="Set a group's caps (admins only; all null: none). A member without a cap of their own has, per "
            "field, the most generous cap among their groups', else the default's")
def set_group_quota(name: str, body: QuotaIn, request: Request):
    group = _group(request, name)
    usage = _usage(request)
    usage.set_group_quota(group.id, group.name, QuotaRecord(body.tokens_per_day, body.tokens_per_month,
                                                            body.requests_per_minute))
    return {"group": group.name, "own": quota_out(usage.group_quota(group.id))}


def _group(request: Request, name: str):
    try:
        return services(request).groups.group(name)
    except GroupNotFound as exc:
        raise ApiError(404, str(exc), code="not_found", param="name") from None
