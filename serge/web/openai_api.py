"""The OpenAI-compatible API: `/v1/models` and `/v1/chat/completions`.

HTTP only: it parses and checks the request, asks the engine for a stream, and
formats the reply as JSON or server-sent events. A client that goes away
cancels its generation.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool

from serge.engine import Engine, FinishReason, GenerationRecord, Message, SamplingParams, Stream
from serge.web.docs import COMPLETION
from serge.web.errors import ApiError, describe_validation, error_body

MAX_MESSAGES_PER_REQUEST = 500
MAX_MESSAGE_CHARS = 100_000

router = APIRouter(prefix="/v1", tags=["OpenAI-compatible"])


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessageIn(BaseModel):
    role: Literal["system", "user", "assistant"] = Field(description="system, user or assistant.")
    content: str | list[TextPart] = Field(description="The text, or a list of text parts.")
    name: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # OpenAI clients send fields we have no use for

    model: str | None = Field(None, description="An installed model; the server's default when left out.")
    messages: list[ChatMessageIn] = Field(min_length=1, max_length=MAX_MESSAGES_PER_REQUEST)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, description="Only 1 is supported.")
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    top_k: int | None = Field(None, description="Not in OpenAI's API: keep the k most likely tokens.")
    min_p: float | None = Field(None, description="Not in OpenAI's API: minimum probability relative to the top token.")
    repetition_penalty: float | None = Field(None, description="Not in OpenAI's API: >1 discourages repeats.")
    ignore_eos: bool | None = Field(None, description="Not in OpenAI's API: generate past end-of-turn (benchmarks).")

    def sampling(self) -> SamplingParams:
        try:
            return SamplingParams(
                temperature=self.temperature,
                top_p=self.top_p,
                top_k=self.top_k,
                min_p=self.min_p,
                max_new_tokens=self.max_completion_tokens or self.max_tokens,
                repetition_penalty=self.repetition_penalty,
                frequency_penalty=self.frequency_penalty,
                presence_penalty=self.presence_penalty,
                stop=self.stop,
                seed=self.seed,
                ignore_eos=self.ignore_eos,
            )
        except ValidationError as exc:
            message, param = describe_validation(exc.errors())
            param = {"max_new_tokens": "max_tokens"}.get(param, param)
            raise ApiError(400, message.replace("max_new_tokens", "max_tokens"), code="invalid_value",
                           param=param) from None

    def conversation(self) -> list[Message]:
        messages = []
        for i, m in enumerate(self.messages):
            text = m.text()
            if len(text) > MAX_MESSAGE_CHARS:
                raise ApiError(400, f"messages.{i}.content is {len(text)} characters; the limit is "
                                    f"{MAX_MESSAGE_CHARS}", code="invalid_value", param=f"messages.{i}.content")
            if m.role == "system" and i != 0:
                raise ApiError(400, f"messages.{i}: a system message may only come first",
                               code="invalid_value", param=f"messages.{i}.role")
            messages.append(Message(m.role, text))
        if messages[-1].role == "assistant":
            raise ApiError(400, "the last message must be from the user (or the system), not the assistant",
                           code="invalid_value", param="messages")
        return messages


def _engine(request: Request) -> Engine:
    return request.app.state.engine


@router.get("/models", summary="List installed models")
def list_models(request: Request):
    engine = _engine(request)
    local = [{"id": m.name, "object": "model", "created": int(m.path.stat().st_mtime), "owned_by": "serge"}
             for m in engine.catalog.installed()]
    remote = [{"id": name, "object": "model", "created": 0, "owned_by": remote.url}
              for name, remote in engine.remote.models.items()]
    return {"object": "list", "data": local + remote}


def _usage(record: GenerationRecord) -> dict:
    return {
        "prompt_tokens": record.prompt_tokens,
        "completion_tokens": record.completion_tokens,
        "total_tokens": record.prompt_tokens + record.completion_tokens,
    }


def _finish_reason(record: GenerationRecord) -> str:
    return "length" if record.finish_reason is FinishReason.LENGTH else "stop"


async def _cancel_on_disconnect(request: Request, stream: Stream) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    stream.cancel()


@router.post("/chat/completions", responses=COMPLETION, summary="Create a chat completion (streamed or not)")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    if body.n != 1:
        raise ApiError(400, f"n={body.n} is not supported; Serge returns exactly one choice (n=1)",
                       code="invalid_value", param="n")
    params = body.sampling()
    messages = body.conversation()
    engine = _engine(request)
    name = body.model or engine.settings.default_model
    stream = await run_in_threadpool(engine.chat, name, messages, params)
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())

    if not body.stream:
        watcher = asyncio.create_task(_cancel_on_disconnect(request, stream))
        try:
            text = "".join([delta async for delta in stream])
        finally:
            watcher.cancel()
        record = stream.record
        if record.finish_reason is FinishReason.ERROR:
            raise ApiError(500, f"generation failed: {record.error}", code="generation_failed")
        return {
            "id": completion_id,
            "object": "chat.completion",
            "created": created,
            "model": name,
            "seed": record.seed,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": _finish_reason(record)}],
            "usage": _usage(record),
        }

    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    def chunk(delta: dict, finish: str | None = None, **extra) -> str:
        payload = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": name,
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
        return f"data: {json.dumps(payload)}\n\n"

    async def events():
        try:
            yield chunk({"role": "assistant", "content": ""})
            async for delta in stream:
                yield chunk({"content": delta})
            record = stream.record
            if record.finish_reason is FinishReason.ERROR:
                yield f"data: {json.dumps(error_body(f'generation failed: {record.error}', status=500))}\n\n"
            else:
                yield chunk({}, _finish_reason(record), seed=record.seed)
                if include_usage:
                    usage = {"id": completion_id, "object": "chat.completion.chunk", "created": created,
                             "model": name, "choices": [], "usage": _usage(record)}
                    yield f"data: {json.dumps(usage)}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            if not stream.done:  # the client went away mid-reply
                stream.cancel()

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
