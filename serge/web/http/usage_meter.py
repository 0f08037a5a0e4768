"""Quotas before a model runs, usage after: one pure ASGI middleware for every dialect.

A POST to a route that runs a model (`MODEL_ROUTES`), from a signed-in user, is admitted by
`serge.accounts.Usage` before the route runs; a request past a cap is answered 429 with
Retry-After, in the shape of the dialect it was sent to (`errors.problem` and `error_body`). Once
the route has noted its generations (`request_log.note_generation`) or its embedding, the tokens
each reported to its client are recorded, before the last byte of the answer is sent, so a client
that reads its usage next finds this request counted. A generation still running when the answer
ends (a chat reply that goes on without its page, a client that left) is recorded when it ends,
with the tokens it made. Requests made while Serge has no accounts are recorded as "local" and never
capped. It holds no counts of its own: the database does.
"""

from __future__ import annotations

import asyncio
import logging
import re

from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from serge.accounts import LOCAL_USER, QuotaExceeded, Usage
from serge.engine import Stream
from serge.store import DatabaseUnavailable, UsageCount
from serge.web.http.errors import error_body, problem

log = logging.getLogger(__name__)

# Each route that runs a model, and the dialect it speaks.
MODEL_ROUTES: tuple[tuple[re.Pattern, str], ...] = (
    (re.compile(r"/v1/(?:chat/completions|completions|embeddings)"), "openai"),
    (re.compile(r"/v1/responses"), "responses"),
    (re.compile(r"/v1/messages"), "anthropic"),
    (re.compile(r"/api/(?:chat|generate|embed|embeddings)"), "ollama"),
    (re.compile(r"/api/chats/[^/]+/(?:messages|regenerate|messages/[^/]+/edit)"), "serge"),
)


def dialect_of(path: str) -> str | None:
    return next((name for pattern, name in MODEL_ROUTES if pattern.fullmatch(path)), None)


def counts(user_id: str, key_id: str, model: str, dialect: str, stream: Stream) -> UsageCount:
    """What a finished stream reported to its client: the prompt once, the tokens of every choice."""
    records = stream.records
    return UsageCount(user_id=user_id, key_id=key_id, model=model, dialect=dialect,
                      prompt_tokens=records[0].prompt_tokens, cached_tokens=records[0].cached_tokens,
                      completion_tokens=sum(r.completion_tokens for r in records))


class UsageMeter:
    """Inside `Authenticate` (it reads the user and key the request was resolved to)."""

    def __init__(self, app) -> None:
        self.app = app
        self._pending: set[asyncio.Task] = set()  # generations to record once they end

    async def __call__(self, scope, receive, send):
        dialect = dialect_of(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        state = scope.get("state") or {}
        user = state.get("user")
        usage: Usage | None = getattr(scope["app"].state, "usage", None) if dialect else None
        if usage is None or user is None:
            return await self.app(scope, receive, send)
        key_id = state.get("key_id") or ""
        if user is not LOCAL_USER:
            try:
                await run_in_threadpool(usage.admit, user.id, key_id)
            except (QuotaExceeded, DatabaseUnavailable) as exc:  # 429 with the reset, or 503 with the fault
                answer = problem(exc)
                response = JSONResponse(error_body(answer.message, status=answer.status, code=answer.code,
                                                   scope=scope), status_code=answer.status,
                                        headers=answer.headers)
                return await response(scope, receive, send)
        recorded = False

        async def record():
            nonlocal recorded
            if not recorded:
                recorded = True
                await self._record(usage, scope, user.id, key_id, dialect)

        async def send_recorded(message):
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                await record()
            await send(message)

        try:
            await self.app(scope, receive, send_recorded)
        finally:
            await record()

    async def _record(self, usage: Usage, scope, user_id: str, key_id: str, dialect: str) -> None:
        state = scope.get("state") or {}
        model = state.get("log_model") or "-"
        found: list[UsageCount] = []
        if (embedded := state.get("usage_embedded")) is not None:
            found.append(UsageCount(user_id, key_id, model, dialect, embedded, 0, 0))
        for stream in state.get("usage_streams") or ():
            if stream.done:
                found.append(counts(user_id, key_id, stream.model or model, dialect, stream))
            else:
                self._record_when_done(usage, stream, counts_for=(user_id, key_id, stream.model or model, dialect))
        for count in found:
            try:
                await run_in_threadpool(usage.record, count)
            except Exception:  # the answer is the client's: a ledger that cannot be written is logged, not raised
                log.exception("could not record the usage of a request")
        state.pop("usage_streams", None)  # each once, whether the answer ends or breaks off
        state.pop("usage_embedded", None)

    def _record_when_done(self, usage: Usage, stream: Stream, counts_for: tuple[str, str, str, str]) -> None:
        """Record a generation the answer did not wait for, when it ends (its worker tells the stream's watchers)."""
        loop = asyncio.get_running_loop()
        ended = asyncio.Event()

        def wake() -> None:
            if stream.done and not loop.is_closed():
                loop.call_soon_threadsafe(ended.set)

        unwatch = stream.watch(wake)

        async def wait_and_record() -> None:
            try:
                while not stream.done:
                    ended.clear()
                    if stream.done:
                        break
                    await ended.wait()
            finally:
                unwatch()
            try:
                await run_in_threadpool(usage.record, counts(*counts_for, stream))
            except Exception:
                log.exception("could not record the usage of a request")

        task = loop.create_task(wait_and_record())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
