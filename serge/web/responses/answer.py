"""One `/v1/responses` answer, whole or streamed, from the output events of a reply already started.

A plain reply (api.py) and one whose MCP calls Serge runs between passes (mcp_api.py) differ in what
makes their output items; how they end is one rule, kept here: a failed or stopped reply stores
nothing and says so (an error status whole, an `error` event streamed), a finished one is stored
(when `store`) before its last event, and a client that leaves stops the reply.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator, Callable
from typing import TypeVar
from datetime import UTC, datetime

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from serge.engine import ContextTooLong, FinishReason, GenerationRecord, InvalidRequest
from serge.store import DatabaseUnavailable
from serge.web.http.dialects import cancel_on_disconnect, failure, stream_response, sse as sse_line
from serge.web.http.errors import ApiError
from serge.web.responses.items import new_id
from serge.web.responses.models import CreateResponse
from serge.web.responses.output import echo, response_object, status_of, usage
from serge.web.http.context import services


T = TypeVar("T")


async def started(begin: Callable[[], T]) -> T:
    """`begin()` (a reply's first generation, started in the thread pool), its refusals in this API's words."""
    try:
        return await run_in_threadpool(begin)
    except ContextTooLong as exc:
        raise too_long(exc) from None
    except InvalidRequest as exc:
        if exc.param != "max_tokens":
            raise
        raise ApiError(400, str(exc).replace("max_tokens", "max_output_tokens"), code="invalid_value",
                       param="max_output_tokens") from None


def too_long(exc: ContextTooLong) -> ApiError:
    """A prompt over the window (a later pass's too, its prompt grown by tools' outputs), in this API's words."""
    text = str(exc)
    param = "max_output_tokens" if text.startswith("max_new_tokens") else "input"
    return ApiError(400, text.replace("max_new_tokens", "max_output_tokens"), code="context_length_exceeded",
                    param=param)


async def answer(body: CreateResponse, request: Request, *, owner: str, model: str, items: list[dict], builder,
                 events: Callable[[], AsyncIterator[dict]], record: Callable[[], GenerationRecord], reply):
    """Answer `body`: `events()` yields the output events as the reply makes them (through `builder`, whose
    `output` and `finish` make the items), `record()` is the reply's last record once they are spent, and
    `reply` (a Stream, or a turn of several) is what a client that leaves cancels."""
    response_id, created, request_echo = new_id("resp"), int(time.time()), echo(body)

    def whole(status: str, done: GenerationRecord | None = None, output: list | None = None) -> dict:
        return response_object(response_id, created, model, status, builder.output if output is None else output,
                               usage(done) if done else None, request_echo, body.previous_response_id)

    async def keep(done: GenerationRecord) -> None:
        if body.store:
            await run_in_threadpool(
                services(request).responses.keep, owner, id=response_id, model=model, status=status_of(done),
                previous_response_id=body.previous_response_id, input_items=items, output_items=builder.output,
                usage=usage(done), request=request_echo, created_at=datetime.fromtimestamp(created, UTC))

    if not body.stream:
        watcher = cancel_on_disconnect(request, reply)
        try:
            async for _ in events():
                pass
        except ContextTooLong as exc:
            raise too_long(exc) from None
        finally:
            watcher.cancel()
        done = record()
        if done.finish_reason is FinishReason.ERROR:
            raise failure(done)
        if done.finish_reason is FinishReason.CANCELLED:  # the client left, or the server is stopping
            raise ApiError(503, "the reply was stopped before it finished; nothing was stored", code="cancelled")
        builder.finish(done)
        await keep(done)
        return whole(status_of(done), done)

    numbers = itertools.count()

    def sse(event: dict) -> str:
        event["sequence_number"] = next(numbers)
        return sse_line(event, event["type"])

    def error_event(message: str, code: str) -> str:
        return sse({"type": "error", "code": code, "message": message, "param": None})

    async def streamed():
        # as it starts: no item yet (each comes in its own output_item.added, listings made already included)
        yield sse({"type": "response.created", "response": whole("in_progress", output=[])})
        yield sse({"type": "response.in_progress", "response": whole("in_progress", output=[])})
        try:
            async for event in events():
                yield sse(event)
        except ContextTooLong as exc:
            yield error_event(str(exc), "context_length_exceeded")
            return
        done = record()
        if done.finish_reason is FinishReason.ERROR:  # nothing is stored
            yield error_event(f"generation failed: {done.error}",
                              "remote_model_failed" if done.remote_error else "generation_failed")
            return
        if done.finish_reason is FinishReason.CANCELLED:
            yield error_event("the reply was stopped before it finished; nothing was stored", "cancelled")
            return
        for event in builder.finish(done):
            yield sse(event)
        try:
            await keep(done)
        except DatabaseUnavailable as exc:  # say so in the stream's own terms
            yield error_event(f"the response could not be stored: {exc}", "database_unavailable")
            return
        status = status_of(done)
        yield sse({"type": f"response.{status}", "response": whole(status, done)})

    return stream_response(streamed(), reply)
