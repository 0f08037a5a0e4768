"""One error shape for every endpoint: OpenAI's, with a message that says what to fix.

Routes raise `ApiError`, or let the exceptions of the layers below through:
`ERRORS` says once what each of those means (status, code, field), for every
router and for the CLI's exit messages. The handlers here turn them into
`{"error": {"message", "type", "param", "code"}}`, with a 4xx status for anything
the client can fix. A dialect with a shape of its own declares it (`ErrorShape`: its
paths and its body) and the app registers it (`install_error_handlers`); this module
names no dialect's paths.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from serge.accounts import InvalidAccountInput, QuotaExceeded
from serge.tools import (ToolServerCheckFailed, ToolServerError, ToolServerForbidden, ToolServerNotFound,
                         ToolServerUnreachable)
from serge.chats import (ChatBusy, ChatNotFound, CollectionReadOnly, InvalidChatInput, InvalidCollectionInput,
                         MessageNotFound, PresetForbidden)
from serge.documents import FileTooLarge, UnreadableFile, UnsupportedFile
from serge.engine import (ContextTooLong, DeviceUnavailable, EngineBusy, ImageTooLarge, InvalidModelName, InvalidRequest,
                          InvalidSource, ModelInUse, ModelLoadFailed, ModelNotFound, ModelTooLarge, PullFailed,
                          PullNotFound, PullRefused)
from serge.store import PresetExists, PresetNotFound
from serge.store.people.groups import GroupNotFound
from serge.store import CollectionExists, CollectionNotFound, DatabaseUnavailable, DocumentNotFound, KeyNotFound, LastAdmin, NameTaken, ResponseNotFound, UserNotFound


DATABASE_RETRY_S = 5
ROUTES = ("OpenAI's API under /v1 (/v1/models, /v1/chat/completions, /v1/responses, /v1/completions, "
          "/v1/embeddings), Anthropic's at /v1/messages, Serge's chat API under /api/chats, /api/knowledge, /api/presets, /api/models and "
          "/api/health, Ollama's /api/chat, /api/generate, /api/embed, /api/tags, /api/show, /api/ps, /api/version, "
          "/api/pull and /api/delete")


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.headers = headers


class ErrorDetail(BaseModel):
    message: str = Field(description="What went wrong and what to change.")
    type: str = Field(description="invalid_request_error for 4xx, server_error for 5xx.")
    param: str | None = Field(description="The request field at fault, when there is one.")
    code: str | None = Field(description="A stable, machine-readable reason.")


class ErrorResponse(BaseModel):
    """The body of every error answer (the API reference lists it for each operation)."""

    error: ErrorDetail


def openai_error(message: str, status: int, code: str | None = None, param: str | None = None) -> dict:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass(frozen=True)
class ErrorShape:
    """A dialect's error body (message, status, code, param -> JSON) and the paths that answer in it: each a
    path, or a folder of paths."""

    paths: tuple[str, ...]
    body: Callable[[str, int, str | None, str | None], dict]
    bare_json: bool = False  # its routes read a body without a Content-Type as JSON (Ollama's, as Ollama does)

    def owns(self, path: str) -> bool:
        return any(path == prefix or path.startswith(prefix + "/") for prefix in self.paths)


def shape_of(scope: dict) -> ErrorShape | None:
    """The registered dialect whose paths the request (`scope`) is for; None: OpenAI's and Serge's own."""
    if "app" in scope:
        path = scope.get("path", "")
        for shape in getattr(scope["app"].state, "error_shapes", ()):
            if shape.owns(path):
                return shape
    return None


def error_body(message: str, *, status: int, code: str | None = None, param: str | None = None,
               scope: dict | None = None) -> dict:
    """An error's body in the shape of the API the request (`scope`) belongs to: a registered dialect's, else
    OpenAI's (Serge's own API, the pages, /v1's OpenAI routes). Every refusal, of every layer, is made here."""
    if scope is not None and (shape := shape_of(scope)) is not None:
        return shape.body(message, status, code, param)
    return openai_error(message, status, code, param)


def error_response(request: Request, status: int, message: str, code: str | None = None, param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status=status, code=code, param=param, scope=request.scope),
                        status_code=status, headers=headers)


def describe_validation(errors) -> tuple[str, str | None]:
    """A readable sentence from pydantic's error list, and the first offending field."""
    parts, first = [], None
    for err in errors[:5]:
        loc = [str(x) for x in err.get("loc", ()) if x not in ("body", "query", "path")]
        field = ".".join(loc) or None
        first = first or field
        msg = err.get("msg", "is invalid")
        if err.get("type") == "extra_forbidden":
            msg = "Serge does not support this field (see /docs for the fields it understands)"
        parts.append(f"{field}: {msg}" if field else msg)
    return "; ".join(parts) or "the request is invalid", first


# The one table: what every exception a request (or a CLI command) can raise below the web layer
# means, as (status, code, the request field at fault). Routers let these through, the handler
# below answers them, and the CLI prints their message; an exception's own `param` wins.
ERRORS: dict[type[Exception], tuple[int, str, str | None]] = {
    ModelNotFound: (404, "model_not_found", "model"),
    InvalidModelName: (400, "invalid_value", "name"),
    InvalidSource: (400, "invalid_value", "source"),
    ModelInUse: (409, "model_in_use", "name"),
    ModelTooLarge: (503, "model_too_large", "model"),
    ModelLoadFailed: (503, "model_load_failed", "model"),
    PullNotFound: (404, "pull_not_found", "pull_id"),
    PullRefused: (409, "pull_refused", "source"),
    PullFailed: (502, "pull_failed", "source"),
    ContextTooLong: (400, "context_length_exceeded", "messages"),
    ChatNotFound: (404, "chat_not_found", "chat_id"),
    MessageNotFound: (404, "message_not_found", "message_id"),
    NameTaken: (409, "name_taken", "name"),
    ResponseNotFound: (404, "response_not_found", "response_id"),
    DocumentNotFound: (404, "document_not_found", "attachments"),
    FileTooLarge: (413, "file_too_large", "file"),
    UnsupportedFile: (415, "unsupported_file", "file"),
    UnreadableFile: (422, "unreadable_file", "file"),
    CollectionNotFound: (404, "collection_not_found", "knowledge"),
    CollectionExists: (409, "collection_exists", "name"),
    CollectionReadOnly: (403, "collection_read_only", "knowledge"),
    GroupNotFound: (404, "not_found", "groups"),
    InvalidCollectionInput: (400, "invalid_value", "name"),
    ToolServerNotFound: (400, "tool_server_not_found", "tools"),
    ToolServerForbidden: (403, "tool_server_forbidden", "tools"),
    ToolServerCheckFailed: (422, "tool_server_unreachable", "url"),
    PresetNotFound: (404, "preset_not_found", "preset_id"),
    PresetExists: (409, "preset_exists", "name"),
    PresetForbidden: (403, "admin_only", "shared"),
    DeviceUnavailable: (503, "device_unavailable", None),
    InvalidRequest: (400, "invalid_value", None),
    ImageTooLarge: (413, "image_too_large", None),
    EngineBusy: (503, "engine_busy", None),
    DatabaseUnavailable: (503, "database_unavailable", None),
    InvalidChatInput: (400, "invalid_value", None),
    ChatBusy: (409, "chat_busy", None),
    InvalidAccountInput: (400, "invalid_value", None),
    UserNotFound: (404, "not_found", None),
    KeyNotFound: (404, "not_found", None),
    LastAdmin: (409, "last_admin", None),
    ToolServerUnreachable: (502, "tool_server_unreachable", None),
    ToolServerError: (400, "invalid_value", None),
    QuotaExceeded: (429, "quota_exceeded", None),
}


def problem(exc: Exception) -> ApiError | None:
    """The answer `ERRORS` gives `exc` (the nearest class in its hierarchy), or None for one it does not know."""
    for kind in type(exc).__mro__:
        if kind in ERRORS:
            status, code, param = ERRORS[kind]
            break
    else:
        return None
    message, headers = str(exc), None
    if isinstance(exc, EngineBusy):
        retry = max(1, round(exc.retry_after_s))
        message = message if "try again" in message else f"{message}; try again in {retry} s"
        headers = {"Retry-After": str(retry)}
    elif isinstance(exc, QuotaExceeded):
        headers = {"Retry-After": str(exc.retry_after_s)}
    elif isinstance(exc, DatabaseUnavailable):
        message, headers = f"Serge could not use its database: {exc}", {"Retry-After": str(DATABASE_RETRY_S)}
    return ApiError(status, message, code=code, param=getattr(exc, "param", None) or param, headers=headers)


def install_error_handlers(app: FastAPI, shapes: Sequence[ErrorShape] = ()) -> None:
    """Answer every known error in OpenAI's shape, or in the shape of the dialect (`shapes`) a path belongs to."""
    app.state.error_shapes = tuple(shapes)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return error_response(request, exc.status, exc.message, exc.code, exc.param, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        message, param = describe_validation(exc.errors())
        return error_response(request, 400, message, "invalid_value", param)

    async def _known(request: Request, exc: Exception):
        answer = problem(exc)
        return error_response(request, answer.status, answer.message, answer.code, answer.param, answer.headers)

    for kind in ERRORS:
        app.add_exception_handler(kind, _known)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        message, code = str(exc.detail), None
        if exc.status_code == 404 and exc.detail == "Not Found":  # no route at all: say which exist
            message, code = (f"Serge has no route {request.method} {request.url.path}; it serves {ROUTES} "
                             f"(the full list is at /docs)"), "route_not_found"
        elif exc.status_code == 405:
            message, code = f"{request.url.path} does not take {request.method} (see /docs)", "method_not_allowed"
        return error_response(request, exc.status_code, message, code, None, getattr(exc, "headers", None))
