"""OpenAI's legacy `/v1/completions`: raw text in, its continuation out (no chat template).

Editor autocomplete plugins speak it, with `suffix` for fill-in-the-middle where the
model has FIM tokens (else a 400). HTTP only: the request is checked here, the
engine's `complete` does the work, and the answer is OpenAI's `text_completion`
shape, whole or as server-sent events ending with `data: [DONE]`. A list of
prompts gives one choice each, in order.
"""

from __future__ import annotations

import json
import time
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import Field, ValidationError
from starlette.concurrency import run_in_threadpool

from serge.engine import FinishReason, GenerationRecord, SamplingParams, Stream, TokenLogprob
from serge.web.docs import TEXT_COMPLETION
from serge.web.errors import ApiError
from serge.web.dialects import StrictRequest, cancel_on_disconnect, failure, refused_settings
from serge.web.openai_api import fingerprint
from serge.web.request_log import note_generation

router = APIRouter(prefix="/v1", tags=["OpenAI-compatible"])

MAX_PROMPTS = 16
MAX_PROMPT_CHARS = 100_000


class CompletionRequest(StrictRequest):
    model: str | None = Field(None, description="An installed chat model; the server's default when left out.")
    prompt: str | list[str] = Field(description="Text to continue, or a list of texts (one choice each).")
    suffix: str | None = Field(None, max_length=MAX_PROMPT_CHARS,
                               description="Text after the gap: fill in the middle (models with FIM tokens only).")
    max_tokens: int | None = Field(16, ge=1, description="Longest continuation, in tokens (OpenAI's default: 16).")
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logprobs: int | None = Field(None, ge=0, le=5, description="Each token's log-probability, with this many "
                                                               "likeliest alternatives.")
    echo: bool = Field(False, description="Put the prompt before the continuation in the text.")
    stream: bool = False
    n: int = Field(1, description="Only 1 is supported.")
    user: str | None = Field(None, description="Accepted for compatibility; no effect.")

    def prompts(self) -> list[str]:
        prompts = [self.prompt] if isinstance(self.prompt, str) else self.prompt
        if not prompts or len(prompts) > MAX_PROMPTS:
            raise ApiError(400, f"prompt needs 1 to {MAX_PROMPTS} texts", code="invalid_value", param="prompt")
        for i, text in enumerate(prompts):
            if len(text) > MAX_PROMPT_CHARS:
                raise ApiError(400, f"prompt[{i}] is {len(text)} characters; the limit is {MAX_PROMPT_CHARS}",
                               code="invalid_value", param="prompt")
        if self.n != 1:
            raise ApiError(400, f"n={self.n} is not supported; Serge returns one choice per prompt (n=1)",
                           code="invalid_value", param="n")
        return prompts

    def sampling(self) -> SamplingParams:
        try:
            return SamplingParams(temperature=self.temperature, top_p=self.top_p, max_new_tokens=self.max_tokens,
                                  stop=self.stop, seed=self.seed, frequency_penalty=self.frequency_penalty,
                                  presence_penalty=self.presence_penalty, logprobs=self.logprobs)
        except ValidationError as exc:
            raise refused_settings(exc, {"max_new_tokens": "max_tokens"}) from None


def _finish(record: GenerationRecord) -> str:
    return "length" if record.finish_reason is FinishReason.LENGTH else "stop"


def _logprobs(tokens: list[TokenLogprob], offset: int) -> dict:
    """The legacy shape: parallel lists, and each token's place in the text."""
    offsets, at = [], offset
    for t in tokens:
        offsets.append(at)
        at += len(t.token)
    return {"tokens": [t.token for t in tokens], "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": [{a.token: a.logprob for a in t.top} for t in tokens], "text_offset": offsets}


@router.post("/completions", responses=TEXT_COMPLETION, summary="Continue a text (the legacy completions API; suffix: fill in the middle)")
async def completions(body: CompletionRequest, request: Request):
    prompts, params = body.prompts(), body.sampling()
    engine = request.app.state.engine
    streams: list[Stream] = []
    try:
        for text in prompts:  # all queued at once: they decode in one batch
            streams.append(await run_in_threadpool(engine.complete, body.model, text, params, body.suffix))
    except BaseException:
        for stream in streams:
            stream.cancel()
        raise
    name = streams[0].model
    note_generation(request, name, streams[0])
    completion_id, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    wants = body.logprobs is not None

    def head(text: str) -> str:
        return text if body.echo and not body.suffix else ""

    if not body.stream:
        choices, usage = [], {"prompt_tokens": 0, "completion_tokens": 0}
        watcher = cancel_on_disconnect(request, *streams)
        try:
            for index, (text, stream) in enumerate(zip(prompts, streams)):
                tokens = [t async for delta in stream.adeltas() for t in delta.tokens]
                record = stream.record
                if record.finish_reason is FinishReason.ERROR:
                    raise failure(record)
                prefix = head(text)
                choices.append({"index": index, "text": prefix + record.text, "finish_reason": _finish(record),
                                "logprobs": _logprobs(tokens, len(prefix)) if wants else None})
                usage["prompt_tokens"] += record.prompt_tokens
                usage["completion_tokens"] += record.completion_tokens
        finally:
            watcher.cancel()
            for stream in streams:
                stream.cancel()
        return {"id": completion_id, "object": "text_completion", "created": created, "model": name,
                "system_fingerprint": fingerprint(name), "choices": choices,
                "usage": {**usage, "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]}}

    def chunk(index: int, text: str, finish: str | None = None, tokens: list[TokenLogprob] | None = None,
              offset: int = 0) -> str:
        choice = {"index": index, "text": text, "finish_reason": finish,
                  "logprobs": _logprobs(tokens, offset) if wants and tokens else None}
        return "data: " + json.dumps({"id": completion_id, "object": "text_completion", "created": created,
                                      "model": name, "system_fingerprint": fingerprint(name),
                                      "choices": [choice]}) + "\n\n"

    async def events():
        try:
            for index, (text, stream) in enumerate(zip(prompts, streams)):
                sent = head(text)
                if sent:
                    yield chunk(index, sent)
                async for delta in stream.adeltas():
                    if delta.text:
                        yield chunk(index, delta.text, tokens=list(delta.tokens), offset=len(sent))
                        sent += delta.text
                record = stream.record
                if record.finish_reason is FinishReason.ERROR:
                    yield "data: " + json.dumps({"error": {"message": f"generation failed: {record.error}",
                                                           "type": "server_error"}}) + "\n\n"
                    break
                yield chunk(index, "", _finish(record))
            yield "data: [DONE]\n\n"
        finally:
            for stream in streams:  # the client went away mid-reply, or the reply is done
                stream.cancel()

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
