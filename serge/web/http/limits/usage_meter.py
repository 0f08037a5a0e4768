"""Quotas before a model runs, usage after: one pure ASGI middleware for every dialect.

A request to a route that runs a model (its router declares it: `context.RouteKind`), from a signed-in user,
is admitted by
`serge.accounts.Reservations` before the route runs (its caps checked, the request counted in its
minute, a ticket opened); a request past a cap is answered 429 with Retry-After, in the shape of the
dialect it was sent to (`errors.problem` and `error_body`). The route runs inside `metering(ticket)`,
so wherever it starts a model (`reserve_streams`, `reserve_inputs`) the budget is held on the ticket,
or refused with the same 429. Once the route has noted its generations
(`request_log.note_generation`) or its embedding, the request settles to the tokens each reported to
its client, before the last byte of the answer is sent, so a client that reads its usage next finds
this request counted. A generation still running when the answer ends (a chat reply that goes on
without its page, a client that left) settles when it ends, with the tokens it made. Requests made
while Serge has no accounts are recorded as "local" and never capped. It holds no counts of its own:
the database does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import anyio
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from serge.accounts import LOCAL_USER, QuotaExceeded, Usage
from serge.accounts.reservations import Reservations, Ticket, metering
from serge.engine import Stream
from serge.store import DatabaseUnavailable, UsageCount
from serge.web.http.context import context_of, services_of
from serge.web.http.errors import error_body, problem

log = logging.getLogger(__name__)


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
        self._pending: set[asyncio.Task] = set()  # requests to settle once their generations end

    async def __call__(self, scope, receive, send):
        noted = context_of(scope) if scope["type"] == "http" else None
        dialect = noted.kind.dialect if noted is not None and noted.metered else None  # as its router declares
        user = noted.user if noted is not None else None
        usage: Usage | None = services_of(scope).usage if dialect else None
        if usage is None or user is None:
            return await self.app(scope, receive, send)
        key_id = noted.key_id or ""
        reservations: Reservations | None = services_of(scope).reservations
        ticket = None
        if user is not LOCAL_USER and reservations is not None:
            try:
                ticket = await run_in_threadpool(reservations.open, user.id, key_id, dialect)
            except (QuotaExceeded, DatabaseUnavailable) as exc:  # 429 with the reset, or 503 with the fault
                answer = problem(exc)
                response = JSONResponse(error_body(answer.message, status=answer.status, code=answer.code,
                                                   scope=scope), status_code=answer.status,
                                        headers=answer.headers)
                return await response(scope, receive, send)
        ended = False

        async def end():
            nonlocal ended
            if not ended:
                ended = True
                with anyio.CancelScope(shield=True):  # a cancelled request still settles its reservation
                    await self._end(usage, reservations, ticket, scope, user.id, key_id, dialect)

        async def send_recorded(message):
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                await end()
            await send(message)

        with metering(reservations, ticket):
            try:
                await self.app(scope, receive, send_recorded)
            finally:
                await end()

    async def _end(self, usage: Usage, reservations: Reservations | None, ticket: Ticket | None, scope,
                   user_id: str, key_id: str, dialect: str) -> None:
        """Settle the request (record it, for a request of no ticket) with what its client was told, now, or
        once its generations still running end."""
        noted = context_of(scope)
        model = noted.model or "-"
        fixed: list[UsageCount] = []
        embedded, noted.embedded = noted.embedded, None  # each once, whether the answer ends or breaks off
        if embedded is not None:
            fixed.append(UsageCount(user_id, key_id, model, dialect, embedded, 0, 0))
        streams, noted.streams = list(noted.streams), []
        streams += [s for s in (ticket.streams if ticket else ()) if not any(s is t for t in streams)]

        def counted() -> list[UsageCount]:
            return fixed + [counts(user_id, key_id, s.model or model, dialect, s) for s in streams]

        if ticket is None or reservations is None:  # the local user's: recorded, each as it ends
            for stream in [s for s in streams if not s.done]:
                streams.remove(stream)
                self._when_done([stream], lambda s=stream: self._write(
                    usage.record, counts(user_id, key_id, s.model or model, dialect, s)))
            for count in counted():
                await self._write(usage.record, count)
            return
        if all(s.done for s in streams):
            await self._settle(reservations, ticket, counted)
        else:
            self._when_done(streams, lambda: self._settle(reservations, ticket, counted))

    async def _settle(self, reservations: Reservations, ticket: Ticket, counted: Callable[[], list[UsageCount]]):
        try:
            found = counted()
        except Exception:  # then the heartbeat settles it at what it reserved, after the lease
            log.exception("could not count the usage of a request")
            reservations.abandon(ticket)
            return
        await self._write(reservations.settle, ticket, found)

    @staticmethod
    async def _write(call: Callable, *args) -> None:
        try:
            await run_in_threadpool(call, *args)
        except Exception:  # the answer is the client's: a ledger that cannot be written is logged, not raised
            log.exception("could not record the usage of a request")

    def _when_done(self, streams: list[Stream], then: Callable[[], Awaitable[None]]) -> None:
        """Run `then` once every one of `streams` has ended (their worker tells the streams' watchers)."""
        loop = asyncio.get_running_loop()
        ended = asyncio.Event()

        def wake() -> None:
            if all(s.done for s in streams) and not loop.is_closed():
                loop.call_soon_threadsafe(ended.set)

        unwatch = [stream.watch(wake) for stream in streams]

        async def wait_and_settle() -> None:
            try:
                while not all(s.done for s in streams):
                    ended.clear()
                    if all(s.done for s in streams):
                        break
                    await ended.wait()
            finally:
                for stop in unwatch:
                    stop()
            await then()

        task = loop.create_task(wait_and_settle())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
