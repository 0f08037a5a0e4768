"""Ollama's API for generation, `/api/chat` and `/api/generate`, beside Serge's own `/api/*`.

HTTP only: it parses the request (`ollama.models`), asks the engine for a stream
and writes the reply as Ollama does: newline-delimited JSON records (streamed
unless `stream: false`), the last with `done: true`, `done_reason`, the token
counts and the durations in nanoseconds. `/api/chat` trims a conversation longer
than the model's window from its oldest turns, as Ollama does, and says so in its
last record (`truncated`, `dropped_messages`). A client that goes away cancels its
generation. The library's routes (`/api/tags`, `/api/show`, `/api/pull`, ...) are
in `ollama.library`, included here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from datetime import UTC, datetime

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from serge.accounts.reservations import reserve_inputs, reserve_streams
from serge.engine import (ChatRequest, Engine, FinishReason, GenerationRecord, ModelNotFound, Stream,
                          TokenLogprob)
from serge.chats import Presets
from serge.store import PresetRecord
from serge.engine.sharing.party import of as party_of
from serge.web.http.auth import current_user
from serge.web.http.context import RouteKind, services
from serge.web.http.dialects import cancel_on_disconnect, stream_response
from serge.web.http.errors import ApiError
from serge.web.ollama.library import router as library_router
from serge.web.openai.embeddings import MAX_INPUTS as MAX_EMBED_INPUTS
from serge.web.openai.logprobs import token_logprob
from serge.web.ollama.models import (ERRORS_DOC, NDJSON, OllamaChatRequest, OllamaEmbeddingsRequest, OllamaEmbedRequest,
                                     OllamaGenerateRequest, keep_alive_zero, library_name, ollama_name, stream_doc)
from serge.web.http.request_log import note_embedding, note_generation

log = logging.getLogger(__name__)

router = APIRouter(tags=["Ollama-compatible"])
GENERATES = RouteKind("ollama", model=True, streaming=True).depends  # a route that runs a model and may stream its reply
EMBEDS = RouteKind("ollama", model=True).depends  # a route that runs an embedding model
router.include_router(library_router)

def _engine(request: Request) -> Engine:
    return request.app.state.engine


def now() -> str:
    """A timestamp as Ollama writes them (RFC 3339, UTC)."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _ns(seconds: float) -> int:
    return int(max(seconds, 0.0) * 1e9)


def _record(name: str) -> dict:
    return {"model": ollama_name(name), "created_at": now()}


def _unload_when_idle(request: Request, name: str) -> asyncio.Future:
    """keep_alive 0: ask the engine to unload `name` once its replies are done (a plain user's ask is refused
    where others use the model: `Engine.unload_when_idle`); the unload runs on a thread of its own."""
    admin, party = current_user(request).admin, party_of(None)  # the request's party, set by web.http.auth

    def unload() -> None:
        try:
            _engine(request).unload_when_idle(name, party, admin)
        except ModelNotFound:  # removed meanwhile
            pass

    return asyncio.get_running_loop().run_in_executor(None, unload)


def _logprobs(tokens: list[TokenLogprob]) -> list[dict]:
    return [token_logprob(t) for t in tokens]


def _tool_calls(record: GenerationRecord) -> list[dict]:
    """The reply's calls in Ollama's shape (arguments as an object); a call whose arguments are not an object
    (cut by num_predict) is left out."""
    calls = []
    for i, c in enumerate(record.tool_calls):
        try:
            arguments = json.loads(c.arguments or "{}")
        except ValueError:
            continue
        if isinstance(arguments, dict):
            calls.append({"id": c.id, "function": {"index": i, "name": c.name, "arguments": arguments}})
    return calls


def _finish(record: GenerationRecord, started: float, load_s: float) -> dict:
    """The last record's statistics, as Ollama reports them (durations in nanoseconds)."""
    prefill = record.ttft_s or 0.0
    return {"done": True, "done_reason": "length" if record.finish_reason is FinishReason.LENGTH else "stop",
            "total_duration": _ns(time.monotonic() - started), "load_duration": _ns(load_s),
            "prompt_eval_count": record.prompt_tokens, "prompt_eval_duration": _ns(prefill),
            "eval_count": record.completion_tokens, "eval_duration": _ns(record.duration_s - prefill)}


def _failure(record: GenerationRecord) -> tuple[int, str]:
    if record.busy:
        return 503, record.error or "the server is busy"
    return 502 if record.remote_error else 500, f"generation failed: {record.error}"


async def _answer(request: Request, stream: Stream, *, chat: bool, streamed: bool, logprobs: bool,
                  started: float, load_s: float, unload: bool, shown: str | None = None
                  ) -> StreamingResponse | JSONResponse:
    """The reply as Ollama writes it: a record per piece of text (`message` on /api/chat, `response` on
    /api/generate), the tool calls in one record, then the last one with the statistics; or all in one object.
    `shown`: the name the client asked for, where it is not the model's (a preset's)."""
    await run_in_threadpool(reserve_streams, stream)  # its budget held, or QuotaExceeded (the stream cancelled)
    base = stream.model
    name = shown or base
    note_generation(request, name, stream)

    def piece(text: str, calls: list[dict] | None = None, thinking: str = "") -> dict:
        if not chat:
            return {"response": text, **({"thinking": thinking} if thinking else {})}
        message = {"role": "assistant", "content": text, **({"thinking": thinking} if thinking else {})}
        return {"message": {**message, "tool_calls": calls} if calls else message}

    def last(record: GenerationRecord) -> dict:
        trimmed = {"truncated": stream.dropped_messages > 0, "dropped_messages": stream.dropped_messages}
        return {**(trimmed if chat else {}), **_finish(record, started, load_s)}

    if not streamed:
        watcher = cancel_on_disconnect(request, stream)
        texts: list[str] = []
        tokens: list[TokenLogprob] = []
        try:
            async for delta in stream.adeltas():
                texts.append(delta.text)
                tokens.extend(delta.tokens)
        finally:
            watcher.cancel()
            if unload:
                _unload_when_idle(request, base)
        record = stream.record
        if record.finish_reason is FinishReason.ERROR:
            status, message = _failure(record)
            raise ApiError(status, message, code="generation_failed")
        body = {**_record(name), **piece("".join(texts), _tool_calls(record), record.reasoning), **last(record)}
        if logprobs:
            body["logprobs"] = _logprobs(tokens)
        return JSONResponse(body)

    def line(body: dict) -> str:
        return json.dumps(body) + "\n"

    async def lines():
        try:
            async for delta in stream.adeltas():
                if delta.text or delta.reasoning or (logprobs and delta.tokens):
                    body = {**_record(name), **piece(delta.text, thinking=delta.reasoning), "done": False}
                    if logprobs:
                        body["logprobs"] = _logprobs(list(delta.tokens))
                    yield line(body)
            record = stream.record
            if record.finish_reason is FinishReason.ERROR:
                yield line({"error": _failure(record)[1]})
                return
            if chat and (calls := _tool_calls(record)):
                yield line({**_record(name), **piece("", calls), "done": False})
            yield line({**_record(name), **piece(""), **last(record)})
        finally:
            if unload:
                _unload_when_idle(request, base)

    return stream_response(lines(), stream, media_type=NDJSON)


async def _load_or_unload(request: Request, name: str, unload: bool, piece: dict) -> JSONResponse:
    """An empty request: load the model (Ollama's warm-up), or unload it with keep_alive 0."""
    if unload:
        await _unload_when_idle(request, name)
    else:
        await run_in_threadpool(_engine(request).model, name)
    return JSONResponse({**_record(name), **piece, "done": True, "done_reason": "unload" if unload else "load"})


def _named(request: Request, model: str | None) -> tuple[str, PresetRecord | None]:
    """The library name `model` means, and the preset it names (whose base model that is), if it names one."""
    presets: Presets = services(request).presets
    if (preset := presets.find(current_user(request).id, model)) is not None:
        return presets.base_model(preset), preset
    return library_name(_engine(request), model), None


async def _begin(request: Request, body, path: str) -> tuple[float, Engine, str, bool, PresetRecord | None]:
    """What a generating route does first: start the clock, note what it ignores, name the model (and the preset
    named, if one is), read keep_alive."""
    started = time.monotonic()
    body.ignored(path)
    engine = _engine(request)
    name, preset = await run_in_threadpool(_named, request, body.model)
    return started, engine, name, keep_alive_zero(body.keep_alive), preset


def _preset_ask(request: Request, preset: PresetRecord | None, ask: ChatRequest) -> ChatRequest:
    """`ask` with the preset's system prompt, settings and passages (as it is, for no preset)."""
    return ask if preset is None else services(request).presets.use(preset, ask).request


CHAT_DOC = """Ollama's chat. The fields Ollama documents are implemented except: `think` (a model that thinks
gives its thoughts in `message.thinking`; false asks its template not to think, where it can; a model that
does not think answers without it), `keep_alive` other than 0 (Serge unloads by its memory budget).
`images` (base64) go to a model that sees images; to any other they are a 400 naming the installed models
that do. Unknown fields and options are ignored, as Ollama ignores them.
A conversation longer than the model's window loses its oldest turns (the system prompt is kept); the last
record then says `truncated: true` and `dropped_messages`. `truncate: false` makes it a 400 instead."""


@router.post("/api/chat", summary="Ollama: the next message of a chat (streamed as NDJSON unless stream: false)",
             description=CHAT_DOC, responses=stream_doc("The reply"), dependencies=[GENERATES])
async def chat(body: OllamaChatRequest, request: Request):
    started, engine, name, unload, preset = await _begin(request, body, "/api/chat")
    if not body.messages:
        return await _load_or_unload(request, name, unload, {"message": {"role": "assistant", "content": ""}})
    messages = await run_in_threadpool(body.conversation, name)  # its images are read off the event loop
    tools = body.tool_offer()
    params, num_ctx = body.sampling()
    response_format = body.response_format()
    ask = ChatRequest(messages, params, tools, response_format, trim=body.truncate is not False,
                      think=None if body.think is None else body.think is not False, cap=True, window=num_ctx,
                      budget_name="num_predict")
    stream = await _chatting(request, engine, name, preset, ask)
    return await _answer(request, stream, chat=True, streamed=body.streamed, logprobs=bool(body.logprobs),
                         started=started, load_s=time.monotonic() - started, unload=unload,
                         shown=preset and preset.name)


async def _chatting(request: Request, engine, name: str, preset, ask: ChatRequest) -> Stream:
    """The reply to `ask`, with the preset's prompt, knowledge and settings under the request's own."""
    ask = await run_in_threadpool(_preset_ask, request, preset, ask)
    return await run_in_threadpool(engine.chat, name, ask)


GENERATE_DOC = """Ollama's completion of one prompt. `prompt` (and `system`) go through the model's chat template
as one user message; `raw: true` sends the prompt as it is; `suffix` asks for the text between prompt and suffix
(fill-in-the-middle, for models with FIM tokens; else 400). `context` (deprecated in Ollama) is accepted and
ignored, and no `context` is returned. `template` is refused (400); `images` as in /api/chat (not with raw or
suffix). Options as in /api/chat."""


@router.post("/api/generate", summary="Ollama: complete a prompt (streamed as NDJSON unless stream: false)",
             description=GENERATE_DOC, responses=stream_doc("The completion"), dependencies=[GENERATES])
async def generate(body: OllamaGenerateRequest, request: Request):
    started, engine, name, unload, preset = await _begin(request, body, "/api/generate")
    body.check(name)
    if not body.prompt and body.suffix is None:
        return await _load_or_unload(request, name, unload, {"response": ""})
    params, num_ctx = body.sampling()
    response_format = body.response_format()
    if body.raw or body.suffix is not None:
        if response_format is not None:
            raise ApiError(400, "format needs the chat template: leave out raw and suffix, or format",
                           code="invalid_value", param="format")
        if num_ctx is not None:
            log.debug("Ollama /api/generate: num_ctx has no effect on a raw prompt")
        params = params if preset is None else services(request).presets.sampling(preset, params)
        stream = await run_in_threadpool(engine.complete, name, body.prompt or "", params, body.suffix)
    else:
        messages = await run_in_threadpool(body.conversation)
        ask = ChatRequest(messages, params, response_format=response_format, cap=True, window=num_ctx,
                          budget_name="num_predict")
        stream = await _chatting(request, engine, name, preset, ask)
    return await _answer(request, stream, chat=False, streamed=body.streamed, logprobs=bool(body.logprobs),
                         started=started, load_s=time.monotonic() - started, unload=unload,
                         shown=preset and preset.name)


def _texts(texts: list[str]) -> list[str]:
    if not texts or len(texts) > MAX_EMBED_INPUTS or any(not t for t in texts):
        raise ApiError(400, f"input needs 1 to {MAX_EMBED_INPUTS} texts, none of them empty", code="invalid_value",
                       param="input")
    return texts


async def _embed(request: Request, model: str | None, texts: list[str], dimensions: int | None = None):
    engine = _engine(request)
    name = library_name(engine, model or engine.settings.default_embedding_model)
    await run_in_threadpool(reserve_inputs, name, texts)  # held against the user's caps, or QuotaExceeded
    result = await run_in_threadpool(engine.embed, name, texts, dimensions)
    note_embedding(request, result.model, result.prompt_tokens)
    return result


@router.post("/api/embed", summary="Ollama: embeddings for one text or many", responses=ERRORS_DOC,
             dependencies=[EMBEDS])
async def embed(body: OllamaEmbedRequest, request: Request):
    started = time.monotonic()
    texts = _texts([body.input] if isinstance(body.input, str) else body.input)
    result = await _embed(request, body.model, texts, body.dimensions)
    return {"model": ollama_name(result.model), "embeddings": result.vectors.tolist(),
            "total_duration": _ns(time.monotonic() - started), "load_duration": 0,
            "prompt_eval_count": result.prompt_tokens}


@router.post("/api/embeddings", summary="Ollama: the embedding of one text (the older route)", responses=ERRORS_DOC,
             dependencies=[EMBEDS])
async def embeddings(body: OllamaEmbeddingsRequest, request: Request):
    result = await _embed(request, body.model, _texts([body.prompt]))
    return {"embedding": result.vectors[0].tolist()}
