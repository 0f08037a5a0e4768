"""One error shape for every endpoint: OpenAI's, with a message that says what to fix.

Routes raise `ApiError` (or let the engine's own exceptions through); the
handlers here turn them into `{"error": {"message", "type", "param", "code"}}`
with a 4xx status for anything the client can fix.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from serge.engine import (ContextTooLong, EngineBusy, InvalidModelName, InvalidRequest, InvalidSource, ModelInUse,
                          ModelLoadFailed, ModelNotFound, ModelTooLarge, PullNotFound, PullRefused)
from serge.store import DatabaseUnavailable


DATABASE_RETRY_S = 5


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


def error_body(message: str, *, status: int, code: str | None = None, param: str | None = None) -> dict:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _response(status: int, message: str, code: str | None = None, param: str | None = None,
              headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status=status, code=code, param=param), status_code=status,
                        headers=headers)


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


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError):
        return _response(exc.status, exc.message, exc.code, exc.param, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError):
        message, param = describe_validation(exc.errors())
        return _response(400, message, "invalid_value", param)

    @app.exception_handler(ModelNotFound)
    async def _no_model(_: Request, exc: ModelNotFound):
        return _response(404, str(exc), "model_not_found", "model")

    @app.exception_handler(InvalidModelName)
    @app.exception_handler(InvalidSource)
    async def _bad_name(_: Request, exc: ValueError):
        return _response(400, str(exc), "invalid_value", "source" if isinstance(exc, InvalidSource) else "name")

    @app.exception_handler(ModelInUse)
    async def _in_use(_: Request, exc: ModelInUse):
        return _response(409, str(exc), "model_in_use", "name")

    @app.exception_handler(ModelTooLarge)
    async def _too_large(_: Request, exc: ModelTooLarge):
        return _response(503, str(exc), "model_too_large", "model")

    @app.exception_handler(ModelLoadFailed)
    async def _load_failed(_: Request, exc: ModelLoadFailed):
        return _response(503, str(exc), "model_load_failed", "model")

    @app.exception_handler(DatabaseUnavailable)
    async def _no_database(_: Request, exc: DatabaseUnavailable):
        return _response(503, f"Serge could not use its database: {exc}", "database_unavailable", None,
                         {"Retry-After": str(DATABASE_RETRY_S)})

    @app.exception_handler(PullNotFound)
    async def _no_pull(_: Request, exc: PullNotFound):
        return _response(404, str(exc), "pull_not_found", "pull_id")

    @app.exception_handler(PullRefused)
    async def _pull_refused(_: Request, exc: PullRefused):
        return _response(409, str(exc), "pull_refused", "source")

    @app.exception_handler(ContextTooLong)
    async def _too_long(_: Request, exc: ContextTooLong):
        return _response(400, str(exc), "context_length_exceeded", "messages")

    @app.exception_handler(InvalidRequest)
    async def _invalid_request(_: Request, exc: InvalidRequest):
        return _response(400, str(exc), "invalid_value", exc.param)

    @app.exception_handler(EngineBusy)
    async def _busy(_: Request, exc: EngineBusy):
        retry = max(1, round(exc.retry_after_s))
        message = str(exc) if "try again" in str(exc) else f"{exc}; try again in {retry} s"
        return _response(503, message, "engine_busy", None, {"Retry-After": str(retry)})

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException):
        return _response(exc.status_code, str(exc.detail), None, None, getattr(exc, "headers", None))
