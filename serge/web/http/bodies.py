"""What a request body may be, checked once before any route reads it.

The body is read here whole, up to SERGE_MAX_REQUEST_BYTES: past it the answer is 413,
whether the length was declared or the body came chunked (a route reading it would only
see a parse error). A body sent as JSON (or with no content type, which FastAPI reads as
JSON) must be UTF-8 JSON that the rest of Serge can hold: no lone surrogates ("\\ud800"
parses in Python but cannot be stored, streamed or tokenized), no NaN or Infinity, and
integers within 64 bits (what the database stores). Each is a 400 naming the field, for
every route at once, instead of a 500 deep inside one. Routes still check the shape. A
body sent to the JSON APIs without any content type is a 415 saying to send JSON, but on
Ollama's routes, which read it (and a curl -d form) as JSON as Ollama does (any_body.py says when).

It does not decide who may send (guard.py does).
"""

from __future__ import annotations

import json
import math

from starlette.datastructures import Headers
from starlette.responses import JSONResponse

from serge.documents import MAX_FILE_BYTES, FileTooLarge
from serge.web.http.context import context_of
from serge.web.http.errors import error_body
from serge.web.http.any_body import as_json, reads_any_body_as_json
from serge.web.http.asgi import HttpMiddleware

MAX_INT = 2**63 - 1
JSON_APIS = ("/api/", "/v1/")  # paths whose bodies are JSON only
UPLOAD_OVERHEAD_BYTES = 64_000  # the form around the file


class BadJson(ValueError):
    pass


def _short(text: str) -> str:
    return text if len(text) <= 40 else text[:40] + "…"


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BadJson(f"the number {_short(text)} is too large; numbers must be finite")
    return value


def _int64(text: str) -> int:
    try:
        value = int(text)
    except ValueError:  # more digits than Python converts
        value = MAX_INT + 1
    if abs(value) > MAX_INT:
        raise BadJson(f"the integer {_short(text)} does not fit in signed 64 bits (at most {MAX_INT} either way)")
    return value


def _no_constant(name: str):
    raise BadJson(f"{name} is not a JSON number")


def _field(path: list) -> str:
    return ".".join(str(p) for p in path) or "the body"


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def unencodable_text(data) -> tuple[str, str] | None:
    """Where the first string or key that is not valid Unicode is: (`messages.0.content`, its wording)."""
    stack = [(data, [])]
    while stack:  # iterative: nesting depth is bounded only by the body size
        value, path = stack.pop()
        if isinstance(value, str):
            if _has_surrogate(value):
                return _field(path), _field(path)
        elif isinstance(value, dict):
            for key, item in value.items():
                if _has_surrogate(key):
                    return _field(path), f"a key in {_field(path)}"
                stack.append((item, [*path, key]))
        elif isinstance(value, list):
            stack.extend((item, [*path, i]) for i, item in enumerate(value))
    return None


def json_problem(body: bytes) -> tuple[str, str | None] | None:
    """Why `body` is not JSON that Serge can take, and the field at fault; None when it is."""
    try:
        data = json.loads(body, parse_float=_finite, parse_int=_int64, parse_constant=_no_constant)
    except BadJson as exc:
        return f"{exc}; send application/json", None
    except UnicodeDecodeError:
        return "the body is not UTF-8 text; send application/json encoded as UTF-8", None
    except json.JSONDecodeError as exc:
        return (f"the body is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
                "send application/json"), None
    except RecursionError:
        return "the body is nested too deeply; send application/json of a sensible shape", None
    found = unencodable_text(data)
    if found is None:
        return None
    field, wording = found
    return (f"{wording} holds a lone surrogate (a \\ud800-\\udfff escape without its pair), which is not text; "
            "send valid Unicode"), field


def is_upload(scope, content_type: str | None) -> bool:
    """A file sent as multipart/form-data to a route that takes one (its router says so: `RouteKind.upload`)."""
    kind = context_of(scope).kind
    return kind is not None and kind.upload and (content_type or "").lower().startswith("multipart/form-data")


def is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _refuse(scope, status: int, message: str, code: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status=status, code=code, param=param, scope=scope), status_code=status)


class BodyCheck(HttpMiddleware):
    def __init__(self, app, max_bytes: int, max_upload_bytes: int = 0) -> None:
        super().__init__(app)
        self.max_bytes = max_bytes
        self.max_upload_bytes = max(max_bytes, max_upload_bytes)  # a file sent to a chat

    async def http(self, scope, receive, send):
        headers = Headers(scope=scope)
        limit, cap = self.max_bytes, "SERGE_MAX_REQUEST_BYTES sets the cap"
        if is_upload(scope, headers.get("content-type")):
            limit, cap = self.max_upload_bytes, "a file may be at most that large, less its form"
        too_large = _refuse(scope, 413, f"the request body is larger than {limit} bytes; send less "
                                 f"({cap})", "request_too_large")
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            return await too_large(scope, receive, send)

        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before sending its whole body
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return await too_large(scope, receive, send)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)

        content_type = headers.get("content-type")
        if body and reads_any_body_as_json(scope, headers):  # Ollama's routes (any_body.py says when)
            content_type = "application/json"  # said for the route below, which would read it as bytes or a form
            scope = as_json(scope)
        if body and content_type is None and scope["path"].startswith(JSON_APIS):
            return await _refuse(scope, 415, "the body has no Content-Type; this API reads JSON: send it with "
                                      "Content-Type: application/json", "unsupported_media_type")(scope, receive, send)
        if body and (content_type is None or is_json(content_type)):
            problem = json_problem(body)
            if problem is not None:
                message, field = problem
                return await _refuse(scope, 400, message, "invalid_json", field)(scope, receive, send)

        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: only the disconnect is left to hear

        await self.app(scope, replay, send)


async def uploaded(file) -> tuple[str, bytes]:
    """An uploaded file's name and bytes, read no further than the limit per file (413 past it)."""
    data = await file.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise FileTooLarge(f"{file.filename or 'the file'} is larger than {MAX_FILE_BYTES} bytes, the limit per file")
    return file.filename or "file", data
