"""OpenAI's legacy `/v1/completions`: raw text in, its continuation out (no chat template).

Editor autocomplete plugins speak it, with `suffix` for fill-in-the-middle where the
model has FIM tokens (else a 400). HTTP only: the request is checked here, the
engine's `complete` does the work, and the answer is OpenAI's `text_completion`
shape, whole or as server-sent events ending with `data: [DONE]`. A prompt is a
text or a list of the model's token ids, as OpenAI takes them; a list of
prompts gives `n` choices each, in order (prompt i's are indices i*n to i*n+n-1);
a prompt's n choices share its prefill. Stop strings: up to `MAX_STOP_STRINGS`,
more than OpenAI's 4, since autocomplete plugins send more (Continue, 10 to 20).
"""

from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Request
from pydantic import Field, ValidationError, field_validator
from starlette.concurrency import run_in_threadpool

from serge.accounts.reservations import reserve_streams
from serge.engine import ContextTooLong, FinishReason, GenerationRecord, SamplingParams, Stream, TokenLogprob
from serge.web.pages.docs import TEXT_COMPLETION
from serge.web.http.errors import ApiError
from serge.web.http.context import RouteKind
from serge.web.http.dialects import StrictRequest, cancel_on_disconnect, failure, refused_settings, stream_response, SSE_DONE, sse
from serge.web.openai.chat import fingerprint, usage
from serge.web.openai.chat_models import MAX_CHOICES, StreamOptions, check_texts
from serge.web.http.request_log import note_generation

router = APIRouter(prefix="/v1", tags=["OpenAI-compatible"])
GENERATES = RouteKind("openai", model=True, streaming=True).depends  # a route that runs a model and may stream its reply

MAX_PROMPTS = 16
MAX_PROMPT_CHARS = 100_000
MAX_PROMPT_IDS = 32_768


class CompletionRequest(StrictRequest):
    model: str | None = Field(None, description="An installed chat model; the server's default when left out.")
    prompt: str | list[str] | list[int] | list[list[int]] = Field(
        description="Text to continue, a list of the model's token ids, or a list of either (each prompt its own "
                    "choices); a text is tokenized as the model's tokenizer does, ids are taken as they are.")
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
    stream_options: StreamOptions | None = Field(None, description="Only with stream: true; include_usage: a last "
                                                                   "event with the usage of every prompt's choices.")
    n: int = Field(1, ge=1, le=MAX_CHOICES, description=f"Choices per prompt (1 to {MAX_CHOICES}), sharing its "
                                                        "prefill; with seed, choice i uses seed + i.")
    user: str | None = Field(None, description="Accepted for compatibility; no effect.")

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_of_the_shapes(cls, value):
        """One message for any other shape (pydantic would list each shape's complaint); JSON's true is no
        token id (lax validation would take it as 1), nor is 1.0."""
        def ids(x) -> bool:
            return isinstance(x, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in x)
        if isinstance(value, str) or ids(value) or isinstance(value, list) and (
                all(isinstance(x, str) for x in value) or all(ids(x) for x in value)):
            return value
        raise ValueError("send a text, a list of texts, a list of token ids (integers, not true or 1.0), "
                         "or a list of such lists")

    def prompts(self) -> list[str] | list[list[int]]:
        prompts = self.prompt
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if not prompts or len(prompts) > MAX_PROMPTS:
            raise ApiError(400, f"prompt needs 1 to {MAX_PROMPTS} prompts", code="invalid_value", param="prompt")
        check_texts(prompts, "prompt", MAX_PROMPT_CHARS, MAX_PROMPT_IDS)
        if self.echo and any(isinstance(prompt, list) for prompt in prompts):
            raise ApiError(400, "echo repeats a text prompt; send the prompt as text, or leave echo out",
                           code="invalid_value", param="echo")
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
    """The legacy shape: parallel lists, and each token's place in the text. As OpenAI's, a token's
    `top_logprobs` holds the sampled token too, so there are up to `logprobs` + 1 (one for `logprobs: 0`)."""
    offsets, at = [], offset
    for t in tokens:
        offsets.append(at)
        at += len(t.token)
    return {"tokens": [t.token for t in tokens], "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": [{**{a.token: a.logprob for a in t.top}, t.token: t.logprob} for t in tokens],
            "text_offset": offsets}


@router.post("/completions", responses=TEXT_COMPLETION, summary="Continue a text (the legacy completions API; suffix: fill in the middle)",
             dependencies=[GENERATES])
async def completions(body: CompletionRequest, request: Request):
    prompts, params = body.prompts(), body.sampling()
    if body.stream_options is not None and not body.stream:
        raise ApiError(400, "stream_options is only allowed with stream: true", code="invalid_value",
                       param="stream_options")
    engine = request.app.state.engine
    streams: list[Stream] = []
    try:
        for text in prompts:  # all queued at once: they decode in one batch
            streams.append(await run_in_threadpool(engine.complete, body.model, text, params, body.suffix, body.n))
        await run_in_threadpool(reserve_streams, *streams)  # their budgets held, or QuotaExceeded
    except BaseException as exc:
        for stream in streams:
            stream.cancel()
        if isinstance(exc, ContextTooLong):
            exc.param = "prompt"  # the field at fault here, not a chat's messages
        raise
    name = streams[0].model
    note_generation(request, name, *streams)
    completion_id, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    wants = body.logprobs is not None

    def head(text: str) -> str:
        return text if body.echo and not body.suffix else ""

    n = body.n
    if not body.stream:
        choices, counts = [], [0, 0, 0, 0]
        watcher = cancel_on_disconnect(request, *streams)
        try:
            for at, (text, stream) in enumerate(zip(prompts, streams)):
                tokens: list[list[TokenLogprob]] = [[] for _ in range(n)]
                async for delta in stream.adeltas():
                    tokens[delta.choice].extend(delta.tokens)
                prefix = head(text)
                for choice, record in enumerate(stream.records):
                    if record.finish_reason is FinishReason.ERROR:
                        raise failure(record)
                    choices.append({"index": at * n + choice, "text": prefix + record.text,
                                    "finish_reason": _finish(record),
                                    "logprobs": _logprobs(tokens[choice], len(prefix)) if wants else None})
                told = usage(stream.records)
                counts = [a + b for a, b in zip(counts, (told["prompt_tokens"], told["completion_tokens"],
                                                         told["total_tokens"],
                                                         told["prompt_tokens_details"]["cached_tokens"]))]
        finally:
            watcher.cancel()
            for stream in streams:
                stream.cancel()
        return {"id": completion_id, "object": "text_completion", "created": created, "model": name,
                "system_fingerprint": fingerprint(name), "choices": choices,
                "usage": {**dict(zip(("prompt_tokens", "completion_tokens", "total_tokens"), counts)),
                          "prompt_tokens_details": {"cached_tokens": counts[3]}}}

    served_by = fingerprint(name)  # once, not a hash per streamed token

    def chunk(index: int, text: str, finish: str | None = None, tokens: list[TokenLogprob] | None = None,
              offset: int = 0) -> str:
        choice = {"index": index, "text": text, "finish_reason": finish,
                  "logprobs": _logprobs(tokens, offset) if wants and tokens else None}
        return sse({"id": completion_id, "object": "text_completion", "created": created, "model": name,
                    "system_fingerprint": served_by, "choices": [choice]})

    async def events():
        counts = [0, 0, 0]
        for at, (text, stream) in enumerate(zip(prompts, streams)):
            sent = [head(text)] * n
            for choice in range(n):
                if sent[choice]:
                    yield chunk(at * n + choice, sent[choice])
            async for delta in stream.adeltas():
                if delta.text:
                    yield chunk(at * n + delta.choice, delta.text, tokens=list(delta.tokens),
                                offset=len(sent[delta.choice]))
                    sent[delta.choice] += delta.text
            records = stream.records
            if failed := next((r for r in records if r.finish_reason is FinishReason.ERROR), None):
                yield sse({"error": {"message": f"generation failed: {failed.error}", "type": "server_error"}})
                break
            for choice, record in enumerate(records):
                yield chunk(at * n + choice, "", _finish(record))
            counts = [a + b for a, b in zip(counts, usage(records).values())]
        else:
            if body.stream_options is not None and body.stream_options.include_usage:
                yield sse({"id": completion_id, "object": "text_completion", "created": created, "model": name,
                           "choices": [], "usage": dict(zip(("prompt_tokens", "completion_tokens", "total_tokens"),
                                                            counts))})
        yield SSE_DONE

    return stream_response(events(), *streams)
