"""What every API dialect shares, so each translator holds only its own shapes: the request models'
bases (null is unset; unknown fields refused, or in echoed items ignored and logged), the streamed
response and the watch that each cancel a reply's generation when its client leaves, the start of a chat
reply (a preset's name read as its request), the error a failed generation gives, and what OpenAI's
reasoning efforts ask of a model that thinks.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Mapping

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from serge.accounts.reservations import reserve_streams
from serge.engine import ChatRequest, GenerationRecord, Stream
from serge.web.http.auth import current_user
from serge.web.http.context import services
from serge.web.http.errors import ApiError, describe_validation

log = logging.getLogger(__name__)

BUSY_RETRY_S = 5  # Retry-After for a request that waited out the queue: slots free as replies end
# A tool's description has no cap of its own (Claude Code's Workflow tool carries ~19,000 characters): the body's
# size (SERGE_MAX_REQUEST_BYTES) and the model's context window are the limits, and a prompt too long is a 400
# naming the window.
TOOL_TEXT = ("What the tool does, for the model; no length limit of its own (the body's size and the model's "
             "window apply).")


class StrictRequest(BaseModel):
    """Unknown fields are a 400 naming them; a field sent as null is a field not sent (generated SDKs send
    every unset field that way), whatever it is."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _null_is_unset(cls, data):
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data


class EchoedItem(StrictRequest):
    """A message or item a client sends back as it got it, with keys of its own: those are ignored (and
    logged at debug level), never a 400."""

    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _note_unknown(cls, data):
        if isinstance(data, dict) and (unknown := sorted(set(data) - set(cls.model_fields))):
            log.debug("ignored in %s: %s", cls.__name__, ", ".join(map(str, unknown))[:200])
        return data


def cancel_on_disconnect(request: Request, *streams: Stream) -> asyncio.Task:
    """A task that cancels `streams` if the client goes away before a whole reply is sent; cancel it after."""

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        for stream in streams:
            stream.cancel()

    return asyncio.create_task(watch())


def stream_response(body: AsyncIterator[str], *streams: Stream,
                    media_type: str = "text/event-stream") -> StreamingResponse:
    """A body sent as it is made, with nothing held back by a cache or a proxy; a client that leaves before
    its end stops the generation of `streams` (a reply's that goes on without a listener: none)."""

    async def sent():
        try:
            async for piece in body:
                yield piece
        finally:
            for stream in streams:
                if not stream.done:  # the client went away mid-reply
                    stream.cancel()
            await body.aclose()

    return StreamingResponse(sent(), media_type=media_type,
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


SSE_DONE = "data: [DONE]\n\n"  # OpenAI's streams end with it


def sse(data, event: str | None = None) -> str:
    """One server-sent event: its JSON `data`, named `event` where the dialect names its events."""
    return (f"event: {event}\n" if event else "") + f"data: {json.dumps(data)}\n\n"


def refused_settings(exc: ValidationError, names: Mapping[str, str]) -> ApiError:
    """SamplingParams' refusal in the dialect's own field names (`names`: ours -> theirs), a 400 naming the field."""
    message, param = describe_validation(exc.errors())
    for ours, theirs in names.items():
        message = message.replace(f"{ours}:", f"{theirs}:")
    return ApiError(400, message, code="invalid_value", param=names.get(param, param))


def start_chat(request: Request, name: str | None, ask: ChatRequest, counted: bool = True) -> Stream:
    """The engine's stream for `ask` sent to `name`, a model's or a preset's (`serge.chats.presets` makes the
    preset's request), its budget reserved (`serge.accounts.reservations`); the stream names what the client
    asked for. Blocking: call it in the thread pool."""
    applied = services(request).presets.apply(current_user(request).id, name, ask)
    stream = request.app.state.engine.chat(applied.model, applied.request)
    if applied.preset is not None:
        stream.model = applied.preset.name
    reserve_streams(stream, counted=counted)  # its budget held against the user's caps, or QuotaExceeded (the stream cancelled)
    return stream


def failure(record: GenerationRecord) -> ApiError:
    """A generation that failed: 503 when it waited out the queue (the server is busy), 502 when a remote model's
    server was at fault, else Serge's 500."""
    if record.busy:
        return ApiError(503, record.error or "the server is busy", code="engine_busy",
                        headers={"Retry-After": str(BUSY_RETRY_S)})
    if record.remote_error:
        return ApiError(502, f"generation failed: {record.error}", code="remote_model_failed")
    return ApiError(500, f"generation failed: {record.error}", code="generation_failed")


# OpenAI's efforts that ask for (next to) no thinking: a template can only think or not.
NO_THINKING = ("none", "minimal")


def think_for(effort: str | None) -> bool | None:
    """An OpenAI reasoning effort as the engine's `think`: None (unsaid), else whether to think."""
    return None if effort is None else effort not in NO_THINKING
