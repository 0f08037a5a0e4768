"""Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`.

HTTP only: the request is checked and translated by `anthropic.models`, the engine answers
through its one door (`Engine.chat`, `Engine.count_tokens`), and this module writes the reply in
Anthropic's shapes: a message with text and tool_use blocks, or the event stream Anthropic's
clients read (message_start, ping, content_block_start / _delta / _stop, message_delta,
message_stop). Errors take Anthropic's shape (`errors.ANTHROPIC_ERRORS`, which the app registers).
A conversation that does not fit is refused, never cut (clients such as Claude Code manage their
own context); max_tokens above what the window leaves is capped to it, since clients set it for
the largest hosted models. A client that goes away cancels its generation.
"""

from __future__ import annotations

import json
import uuid

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Query, Request
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from serge.engine import ChatRequest, Engine, FinishReason, GenerationRecord, Stream
from serge.web.http.dialects import cancel_on_disconnect, failure, start_chat, stream_response, sse
from serge.web.http.context import RouteKind
from serge.web.anthropic.models import NO_EFFECT_FIELDS, CountTokensRequest, MessagesRequest
from serge.web.anthropic.errors import anthropic_error
from serge.web.http.request_log import note_generation

# --- the reply ------------------------------------------------------------------------------------------
StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class TextOut(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ThinkingOut(BaseModel):
    type: Literal["thinking"] = "thinking"
    thinking: str = Field(description="A thinking model's thoughts before its answer.")
    signature: str = Field("", description="Empty: Serge's thoughts need no signature to be sent back.")


class ToolUseOut(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str = Field(description="toolu_...: a tool_result answers it with this tool_use_id.")
    name: str
    input: dict[str, Any] = Field(description="Valid against the tool's input_schema.")


class UsageOut(BaseModel):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = Field(0, description="Always 0: Serge reuses shared prefixes on its own.")
    cache_read_input_tokens: int = Field(0, description="Always 0.")


class MessageOut(BaseModel):
    """A created message: Anthropic's shape."""

    id: str = Field(description="msg_...")
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str = Field(description="The model that answered, as the library names it.")
    content: list[Annotated[ThinkingOut | TextOut | ToolUseOut, Field(discriminator="type")]]
    stop_reason: StopReason | None
    stop_sequence: str | None = Field(description="With stop_reason stop_sequence: the one that ended the reply.")
    usage: UsageOut


class TokenCountOut(BaseModel):
    input_tokens: int = Field(description="The prompt's tokens, as the model's chat template renders it with "
                                          "the tools.")


class AnthropicErrorDetail(BaseModel):
    type: str = Field(description="invalid_request_error (400 and other 4xx), authentication_error (401), "
                                  "permission_error (403), not_found_error (404), request_too_large (413), "
                                  "rate_limit_error (429), api_error (500, 502), overloaded_error (503).")
    message: str = Field(description="What went wrong and what to change; it names the field at fault.")


class AnthropicErrorResponse(BaseModel):
    """The body of every error answer of /v1/messages: Anthropic's shape."""

    type: Literal["error"] = "error"
    error: AnthropicErrorDetail


router = APIRouter(prefix="/v1", tags=["Anthropic-compatible"])
GENERATES = RouteKind("anthropic", model=True, streaming=True).depends  # a route that runs a model and may stream its reply

_EVENT = {"type": "object", "required": ["event", "data"], "properties": {
    "event": {"enum": ["message_start", "ping", "content_block_start", "content_block_delta", "content_block_stop",
                       "message_delta", "message_stop", "error"]},
    "data": {"type": "string", "contentMediaType": "application/json"}}}
_ERRORS = {"4XX": {"model": AnthropicErrorResponse, "description": "The request cannot be served as sent; the "
                                                                   "message says what to change."},
           502: {"model": AnthropicErrorResponse, "description": "A remote model's server failed."},
           503: {"model": AnthropicErrorResponse, "description": "overloaded_error: every slot and the queue are "
                                                                 "full (retry after Retry-After seconds), or the model "
                                                                 "would not load."}}
RESPONSES = {200: {"description": "A message, or Anthropic's server-sent events with \"stream\": true.",
                   "content": {"text/event-stream": {"schema": _EVENT}}}, **_ERRORS}

MESSAGES_DOC = f"""Anthropic's Messages API, for Claude Code and Anthropic's SDKs (point ANTHROPIC_BASE_URL at
Serge). The key goes in `x-api-key` or `Authorization: Bearer`.

Implemented: system (a string or text blocks; a system message inside messages counts as one, placed
as the model's template allows), text, tool_use and tool_result blocks (tool_result content as a
string or text blocks; is_error results are written as "Error: ..."), a trailing assistant message as
a prefill (the reply continues it), tools with input_schema (local $refs welcome), tool_choice auto,
any, tool, none (and disable_parallel_tool_use), stop_sequences, temperature, top_p, top_k,
output_config.format (json_schema, by constrained decoding), stream. max_tokens is required; above
what the context window leaves after the prompt it is capped to that (stop_reason max_tokens when
reached). A conversation that does not fit the window is a 400 with the token counts: it is never
cut. Consecutive user (or assistant) messages are one turn, as Anthropic's API treats them.

Accepted without effect: {"; ".join(NO_EFFECT_FIELDS)}.

Image blocks (base64 sources) go to a model that sees images; to any other model they are a 400 naming
the installed models that do, and a url source is a 400 (Serge fetches nothing a request names).
Refused with a 400 naming them: server tools (web_search and the like), and any field not listed in
the request schema."""


def _engine(request: Request) -> Engine:
    return request.app.state.engine


def _stop_reason(record: GenerationRecord) -> str:
    if record.finish_reason is FinishReason.LENGTH:
        return "max_tokens"
    if record.tool_calls:
        return "tool_use"
    return "stop_sequence" if record.stop_sequence is not None else "end_turn"


def _tool_use_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def _usage(record: GenerationRecord) -> UsageOut:
    return UsageOut(input_tokens=record.prompt_tokens, output_tokens=record.completion_tokens)


def _input(arguments: str) -> dict:
    try:
        value = json.loads(arguments)
    except ValueError:  # cut short by max_tokens
        return {}
    return value if isinstance(value, dict) else {}


def _client_extras(
    anthropic_version: str | None = Header(None, description="Accepted; Serge speaks 2023-06-01."),
    anthropic_beta: str | None = Header(None, description="Accepted without effect."),
    beta: bool | None = Query(None, description="Accepted without effect (Claude Code sends ?beta=true)."),
) -> None:
    """What Anthropic's clients send beside the body: accepted (and shown in /docs), changing nothing."""


@router.post("/messages", summary="Create a message (Anthropic's Messages API; streamed or not)",
             description=MESSAGES_DOC, response_model=MessageOut, responses=RESPONSES,
             dependencies=[GENERATES, Depends(_client_extras)])
async def create_message(body: MessagesRequest, request: Request):
    messages = await run_in_threadpool(body.conversation)  # its files and images are read off the event loop
    tools, response_format = body.tool_offer(), body.response_format()
    params = body.sampling()  # a bad setting is refused before the model is asked anything
    think = None if body.thinking is None else body.thinking.get("type") != "disabled"
    # Refused when it does not fit (trim=False), max_tokens capped to what the window leaves (cap=True).
    ask = ChatRequest(messages, params, tools, response_format, trim=False, think=think, cap=True)
    stream = await run_in_threadpool(start_chat, request, body.model, ask)
    note_generation(request, stream.model, stream)
    message_id = f"msg_{uuid.uuid4().hex[:24]}"
    if body.stream:
        return stream_response(_events(stream, message_id, stream.prompt_tokens or 0), stream)
    watcher = cancel_on_disconnect(request, stream)
    try:
        async for _ in stream.adeltas():
            pass
    finally:
        watcher.cancel()
    record = stream.record
    if record.finish_reason is FinishReason.ERROR:
        raise failure(record)
    content: list = [ThinkingOut(thinking=record.reasoning)] if record.reasoning else []
    content += [TextOut(text=record.text)] if record.text or not record.tool_calls else []
    content += [ToolUseOut(id=_tool_use_id(c.id), name=c.name, input=_input(c.arguments)) for c in record.tool_calls]
    return MessageOut(id=message_id, model=stream.model, content=content, stop_reason=_stop_reason(record),
                      stop_sequence=record.stop_sequence, usage=_usage(record))


def _sse(kind: str, **data) -> str:
    return sse({"type": kind, **data}, kind)


async def _events(stream: Stream, message_id: str, prompt_tokens: int):
    """Anthropic's event stream: each text run and each tool call is a content block of its own."""
    index, open_kind = -1, None

    def start(kind: str, block: dict) -> str:
        nonlocal index, open_kind
        index, open_kind = index + 1, kind
        return _sse("content_block_start", index=index, content_block=block)

    yield _sse("message_start", message={
        "id": message_id, "type": "message", "role": "assistant", "model": stream.model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": prompt_tokens, "output_tokens": 0}})
    yield _sse("ping")
    async for delta in stream.adeltas():
        if delta.reasoning:
            if open_kind != "thinking":
                if open_kind is not None:
                    yield _sse("content_block_stop", index=index)
                yield start("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            yield _sse("content_block_delta", index=index,
                       delta={"type": "thinking_delta", "thinking": delta.reasoning})
        if delta.text:
            if open_kind != "text":
                if open_kind is not None:
                    yield _sse("content_block_stop", index=index)
                yield start("text", {"type": "text", "text": ""})
            yield _sse("content_block_delta", index=index, delta={"type": "text_delta", "text": delta.text})
        for call in delta.tool_calls:
            if call.id is not None:
                if open_kind is not None:
                    yield _sse("content_block_stop", index=index)
                yield start("tool_use", {"type": "tool_use", "id": _tool_use_id(call.id), "name": call.name,
                                         "input": {}})
            if call.arguments:
                yield _sse("content_block_delta", index=index,
                           delta={"type": "input_json_delta", "partial_json": call.arguments})
    record = stream.record
    if record.finish_reason is FinishReason.ERROR:
        error = (anthropic_error(record.error or "the server is busy", 529) if record.busy else
                 anthropic_error(f"generation failed: {record.error}", 502 if record.remote_error else 500))
        yield _sse("error", error=error["error"])
        return
    if open_kind is None:  # an empty reply is still one (empty) text block
        yield start("text", {"type": "text", "text": ""})
    yield _sse("content_block_stop", index=index)
    yield _sse("message_delta", delta={"stop_reason": _stop_reason(record), "stop_sequence": record.stop_sequence},
               usage={"input_tokens": record.prompt_tokens, "output_tokens": record.completion_tokens})
    yield _sse("message_stop")


@router.post("/messages/count_tokens", summary="Count a message's input tokens (Anthropic's API)",
             response_model=TokenCountOut, responses=_ERRORS,
             description="The tokens the prompt of this conversation (system, messages and tools) takes, as the "
                         "model's chat template renders it. Fields as for /v1/messages, less those of generation.",
             dependencies=[Depends(_client_extras)])
async def count_tokens(body: CountTokensRequest, request: Request):
    messages, tools = await run_in_threadpool(body.conversation), body.tool_offer()
    body.response_format()  # checked, though it changes no count
    count = await run_in_threadpool(_engine(request).count_tokens, body.model, messages, tools)
    return TokenCountOut(input_tokens=count)
