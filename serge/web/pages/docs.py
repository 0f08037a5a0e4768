"""The API reference at /docs, served by Serge itself so that it works offline, and what the
OpenAPI document says every operation answers when it fails.

Swagger UI 5.35.0 (npm's swagger-ui-dist, Apache-2.0) is vendored unchanged in static/swagger/
with its licence and notice; static/docs.js starts it, because no page may run inline script.
Swagger UI sets style attributes, so /docs alone also allows inline styles (never inline script).
FastAPI's own /docs and /redoc load their files from a CDN; the app factory turns them off.

Every operation is documented with the one error shape under 4XX; FastAPI's 422 is dropped, as
the error handlers answer 400. Operations that generate text declare their event streams and
503 (busy) with the constants below. It adds no route but /docs.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.templating import Jinja2Templates

from serge import __version__
from serge.web.http.errors import ErrorResponse
from serge.web.http.headers import POLICY

TEMPLATES = Path(__file__).parent.parent / "templates"
DOCS_POLICY = POLICY.replace("style-src 'self'", "style-src 'self' 'unsafe-inline'")

_ERROR = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
BUSY = {"description": "Unavailable for now, with the reason in error.code: engine_busy (every slot and the queue "
                       "are full; retry after Retry-After seconds), model_load_failed (the model would not load; "
                       "reinstall it or choose another), database_unavailable (the database is locked or the disk "
                       "full; nothing of the request was saved).", "content": _ERROR}
# Open API 3.1 describes an event stream by the schema of one event; `data` holds JSON text.
_JSON_TEXT = {"type": "string", "contentMediaType": "application/json"}
_REPLY_EVENT = {"type": "object", "required": ["event", "data"],
                "properties": {"event": {"enum": ["start", "queued", "delta", "reasoning", "done"]},
                               "data": _JSON_TEXT}}
_CHUNK_EVENT = {"type": "object", "required": ["data"],
                "properties": {"data": {"description": "a chat.completion.chunk, an error, or [DONE]",
                                        "type": "string"}}}

# For routes whose reply is a stream of server-sent events.
EVENT_STREAM = {200: {"description": "Server-sent events: start, queued while waiting, delta with text "
                                     "(and reasoning with the thoughts of a model that thinks), then done "
                                     "with the saved message.",
                      "content": {"text/event-stream": {"schema": _REPLY_EVENT}}}, 503: BUSY}
# For /v1/chat/completions: JSON, or server-sent events with "stream": true.
COMPLETION = {200: {"description": "A chat.completion, or chat.completion.chunk events when streamed.",
                    "content": {"text/event-stream": {"schema": _CHUNK_EVENT}}}, 503: BUSY,
              502: {"description": "A remote model's server failed: silent past SERGE_REMOTE_TIMEOUT_S, hung up "
                                   "mid-reply, or answered an error (error.code remote_model_failed).",
                    "content": _ERROR}}
# For /v1/completions: a text_completion, or its chunks as events with "stream": true.
TEXT_COMPLETION = {**COMPLETION, 200: {
    "description": "A text_completion, or text_completion chunks as events when streamed.",
    "content": {"text/event-stream": {"schema": {**_CHUNK_EVENT, "properties": {"data": {
        "description": "a text_completion chunk, an error, or [DONE]", "type": "string"}}}}}}}
MARKDOWN = {200: {"description": "The chat as JSON or Markdown.",
                  "content": {"text/markdown": {"schema": {"type": "string"}}}}}


def declare_errors(schema: dict) -> None:
    """Give every operation the 4XX error answer, in place of FastAPI's unused 422."""
    error = ErrorResponse.model_json_schema(ref_template="#/components/schemas/{model}")
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.update(error.pop("$defs", {}))
    components["ErrorResponse"] = error
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            responses.setdefault("4XX", {"description": "The request cannot be served as sent; the message says "
                                                        "what to change.", "content": _ERROR})
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)


def install_docs(app: FastAPI) -> None:
    """/docs from Serge's own files, and error answers in /openapi.json."""
    templates = Jinja2Templates(directory=str(TEMPLATES))

    @app.get("/docs", include_in_schema=False)
    def docs(request: Request):
        page = templates.TemplateResponse(request, "docs.html", {"version": __version__})
        page.headers["Content-Security-Policy"] = DOCS_POLICY
        return page

    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            declare_errors(generate())  # generate() keeps its result in app.openapi_schema
        return app.openapi_schema

    app.openapi = openapi
