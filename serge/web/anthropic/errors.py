"""Anthropic's error shape, `{"type": "error", "error": {"type", "message"}}`, for /v1/messages and below.

The error's `type` follows the status as Anthropic's API names them. The app registers this
shape (`build_app`); what each error means is `http.errors.ERRORS`'.
"""

from __future__ import annotations

from serge.web.http.errors import ErrorShape

# Anthropic's error types, by status; other statuses: invalid_request_error below 500, api_error from it.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
               500: "api_error", 503: "overloaded_error", 529: "overloaded_error"}


def anthropic_error(message: str, status: int, code: str | None = None, param: str | None = None) -> dict:
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


ANTHROPIC_ERRORS = ErrorShape(("/v1/messages",), anthropic_error)
