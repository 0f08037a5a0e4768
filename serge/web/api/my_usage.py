"""`GET /api/usage/mine`: the caller's own tokens and requests today and this month, against their caps.

Every user may read it (it is theirs alone); the numbers and words come from `serge.accounts.my_usage`.
HTTP only.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from serge.accounts import LOCAL_USER
from serge.accounts.my_usage import MyUsage, my_usage
from serge.web.http.auth import current_user
from serge.web.http.context import services

router = APIRouter(tags=["usage"])


class SpentOut(BaseModel):
    tokens: int = Field(description="Prompt and generated tokens.")
    requests: int = Field(description="Model requests that ended.")
    cap: int | None = Field(description="The tokens cap that applies (yours, else your groups' most generous, else "
                                        "the default's); null: none.")
    cap_from: str | None = Field(description='Where the cap comes from: "own", "group:NAME", "default"; null: no cap.')
    left: int | None = Field(description="Tokens left under the cap; null: no cap.")
    resets_at: str = Field(description="When this count starts again (UTC, ISO 8601).")


class MyUsageOut(BaseModel):
    user: str
    today: SpentOut = Field(description="This UTC day so far.")
    month: SpentOut = Field(description="This UTC calendar month so far.")
    requests_per_minute: int | None = Field(description="The cap on model requests a minute; null: none.")
    requests_per_minute_from: str | None = Field(description="Where that cap comes from, as `cap_from` says it.")
    summary: list[str] = Field(description="The same in plain words, as the My usage page says it.")


def usage_out(name: str, mine: MyUsage) -> MyUsageOut:
    def spent(count, cap, resets, field) -> SpentOut:
        return SpentOut(tokens=count.tokens, requests=count.requests, cap=cap, cap_from=mine.sources.get(field),
                        left=None if cap is None else max(0, cap - count.tokens), resets_at=resets.isoformat())

    return MyUsageOut(user=name, today=spent(mine.today, mine.caps.tokens_per_day, mine.day_resets, "tokens_per_day"),
                      month=spent(mine.month, mine.caps.tokens_per_month, mine.month_resets, "tokens_per_month"),
                      requests_per_minute=mine.caps.requests_per_minute,
                      requests_per_minute_from=mine.sources.get("requests_per_minute"), summary=mine.sentences())


@router.get("/api/usage/mine", response_model=MyUsageOut,
            summary="Your own tokens and requests today and this month, against your caps (every user)")
async def read_my_usage(request: Request) -> MyUsageOut:
    user = current_user(request)
    mine = await run_in_threadpool(my_usage, services(request).usage, user.id, user is not LOCAL_USER)
    return usage_out(user.name, mine)
