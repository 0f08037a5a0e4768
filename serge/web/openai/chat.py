"""The OpenAI-compatible API: `/v1/models` and `/v1/chat/completions`.

HTTP only: it parses and checks the request (`openai.chat_models`), asks the engine
for a stream, and formats the reply as JSON or server-sent events in OpenAI's
shapes: content, `tool_calls` (streamed as OpenAI streams them: a first piece
with the call's id and name, then pieces of its arguments) and `logprobs`, for each
of the `n` choices (streamed chunks carry their choice's index). A client that
goes away cancels its generation, every choice of it.
"""

from __future__ import annotations

import hashlib
import time
import uuid

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from serge import __version__
from serge.chats import PresetView
from serge.engine import ChatRequest, Engine, FinishReason, GenerationRecord, ModelInfo, TokenLogprob
from serge.web.anthropic.model_list import anthropic_model, anthropic_models
from serge.web.http.auth import current_user
from serge.web.http.context import RouteKind, services
from serge.web.http.dialects import cancel_on_disconnect, failure, start_chat, stream_response, think_for, SSE_DONE, sse
from serge.web.pages.docs import COMPLETION
from serge.web.http.errors import ApiError, openai_error
from serge.web.openai.chat_models import HARMLESS, MAX_CHOICES, REFUSED, ChatCompletionRequest
from serge.web.openai.logprobs import token_logprob
from serge.web.http.request_log import note_generation

router = APIRouter(prefix="/v1", tags=["OpenAI-compatible"])
GENERATES = RouteKind("openai", model=True, streaming=True).depends  # a route that runs a model and may stream its reply


def _engine(request: Request) -> Engine:
    return request.app.state.engine


def _model_out(m: ModelInfo | PresetView) -> dict:
    if isinstance(m, PresetView):  # Serge's own `preset` says what it stands on, and whether that is installed
        p = m.preset
        return {"id": p.name, "object": "model", "created": int(p.created_at.timestamp()), "owned_by": "preset",
                "preset": {"model": p.model, "state": m.state, "shared": p.shared}}
    return {"id": m.name, "object": "model", "created": int(m.created), "owned_by": "remote" if m.remote else "serge"}


MODELS_DOC = """The models a request may name: installed and remote ones, and the caller's presets (`owned_by:
"preset"`, with `preset.model` and `preset.state`: ready, or model_missing once its base model is removed)
right after the chat models. Asked by Anthropic's clients (an `anthropic-version` header), in Anthropic's shape."""


@router.get("/models", summary="List the models a request may name: installed, remote, and presets",
            description=MODELS_DOC)
def list_models(request: Request):
    listed = services(request).presets.among(current_user(request).id, _engine(request).models())
    if "anthropic-version" in request.headers:
        return anthropic_models(listed)
    return {"object": "list", "data": [_model_out(m) for m in listed]}


@router.get("/models/{model_id:path}", summary="One model (or preset) a request may name (404 for any other)")
def get_model(model_id: str, request: Request):
    preset = services(request).presets.find(current_user(request).id, model_id)
    found = services(request).presets.get(current_user(request).id, preset.id) if preset else \
        _engine(request).info(model_id)
    if "anthropic-version" in request.headers:
        return anthropic_model(found)
    return _model_out(found)


def fingerprint(model: str) -> str:
    """OpenAI's system_fingerprint: what served the reply (Serge's version and the model), stable between calls."""
    return "fp_" + hashlib.sha256(f"serge {__version__} {model}".encode()).hexdigest()[:12]


def usage(records: tuple[GenerationRecord, ...]) -> dict:
    """The prompt once (the choices share it), and every choice's completion tokens; of the prompt's, those the
    prefix cache gave (`prompt_tokens_details.cached_tokens`)."""
    prompt, completion = records[0].prompt_tokens, sum(r.completion_tokens for r in records)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": records[0].cached_tokens}}


def _finish_reason(record: GenerationRecord) -> str:
    if record.finish_reason is FinishReason.LENGTH:
        return "length"
    return "tool_calls" if record.tool_calls else "stop"


def _logprobs(tokens: list[TokenLogprob]) -> dict:
    return {"content": [token_logprob(t) for t in tokens], "refusal": None}


COMPLETIONS_DOC = f"""OpenAI's chat completions. Every field listed here is implemented, except
{", ".join(HARMLESS)}, which are accepted and have no effect; any other field ({", ".join(REFUSED)},
...) is refused with a 400 naming it.

response_format (json_object, json_schema) and a required or named tool_choice are enforced by
constrained decoding. Log-probabilities come from the distribution each token was drawn from: after
penalties, logit_bias, the grammar, temperature, top_k, min_p and top_p (renormalized); at
temperature 0, from the unscaled distribution after penalties, logit_bias and the grammar.

n (1 to {MAX_CHOICES}) choices share one prefill of the prompt and decode in one batch; choice i samples
with seed + i (the top-level seed is choice 0's), so a seeded request gives the same choices again and
its choice 0 is the reply n=1 gives. usage counts the prompt once and every choice's tokens."""


@router.post("/chat/completions", responses=COMPLETION, summary="Create a chat completion (streamed or not)",
             description=COMPLETIONS_DOC, dependencies=[GENERATES])
async def chat_completions(body: ChatCompletionRequest, request: Request):
    if body.stream_options is not None and not body.stream:
        raise ApiError(400, "stream_options is only allowed with stream: true", code="invalid_value",
                       param="stream_options")
    params = body.sampling()
    messages = await run_in_threadpool(body.conversation)  # its files and images are read off the event loop
    tools = body.tool_offer()
    think = think_for(body.reasoning_effort)
    # trim=False: an agent managing its context must hear that it does not fit
    ask = ChatRequest(messages, params, tools, body.response_format, trim=False, think=think, n=body.n)
    stream = await run_in_threadpool(start_chat, request, body.model, ask)
    name = stream.model
    note_generation(request, name, stream)
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    wants_logprobs = params.logprobs is not None

    if not body.stream:
        watcher = cancel_on_disconnect(request, stream)
        tokens: list[list[TokenLogprob]] = [[] for _ in range(body.n)]
        try:
            async for delta in stream.adeltas():
                tokens[delta.choice].extend(delta.tokens)
        finally:
            watcher.cancel()
        records = stream.records
        for record in records:
            if record.finish_reason is FinishReason.ERROR:
                raise failure(record)
        return {
            "id": completion_id,
            "object": "chat.completion",
            "created": created,
            "model": name,
            "system_fingerprint": fingerprint(name),
            "seed": records[0].seed,
            "choices": [{"index": i, "message": _message(record), "finish_reason": _finish_reason(record),
                         "logprobs": _logprobs(tokens[i]) if wants_logprobs else None}
                        for i, record in enumerate(records)],
            "usage": usage(records),
        }

    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    served_by = fingerprint(name)  # once, not a hash per streamed token

    def chunk(index: int, delta: dict, finish: str | None = None, tokens: list[TokenLogprob] | None = None,
              **extra) -> str:
        choice = {"index": index, "delta": delta, "finish_reason": finish}
        if wants_logprobs:
            choice["logprobs"] = _logprobs(tokens) if tokens else None
        payload = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": name,
                   "system_fingerprint": served_by, "choices": [choice], **extra}
        return sse(payload)

    async def events():
        pending: list[list[TokenLogprob]] = [[] for _ in range(body.n)]  # tokens whose text is held back
        for index in range(body.n):
            yield chunk(index, {"role": "assistant", "content": ""})
        async for delta in stream.adeltas():
            pending[delta.choice].extend(delta.tokens)
            out: dict = {}
            if delta.reasoning:
                out["reasoning_content"] = delta.reasoning
            if delta.text:
                out["content"] = delta.text
            if delta.tool_calls:
                out["tool_calls"] = [_call_piece(c) for c in delta.tool_calls]
            if out:
                yield chunk(delta.choice, out, tokens=pending[delta.choice])
                pending[delta.choice] = []
        records = stream.records
        if failed := next((r for r in records if r.finish_reason is FinishReason.ERROR), None):
            yield sse(openai_error(f"generation failed: {failed.error}", 500))
        else:
            for index, record in enumerate(records):
                yield chunk(index, {}, _finish_reason(record), tokens=pending[index], seed=record.seed)
            if include_usage:
                tail = {"id": completion_id, "object": "chat.completion.chunk", "created": created,
                        "model": name, "choices": [], "usage": usage(records)}
                yield sse(tail)
        yield SSE_DONE

    return stream_response(events(), stream)


def _message(record: GenerationRecord) -> dict:
    """One choice's message: its text (null beside tool calls alone), thoughts and calls."""
    message = {"role": "assistant", "content": record.text if record.text or not record.tool_calls else None,
               "refusal": None}
    if record.reasoning:
        message["reasoning_content"] = record.reasoning
    if record.tool_calls:
        message["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                 for c in record.tool_calls]
    return message


def _call_piece(c) -> dict:
    """A tool-call delta as OpenAI streams it: the first piece names the call, later ones add arguments."""
    if c.id is not None:
        return {"index": c.index, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
    return {"index": c.index, "function": {"arguments": c.arguments}}
