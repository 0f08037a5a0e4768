"""One structured line per HTTP request, in logfmt, on the `serge.requests` logger.

    request id=3f9c0a1b2c4d5e6f method=POST path=/v1/chat/completions status=200 user=alice key=1a2b3c
      model=smollm2-135m-instruct prompt_tokens=31 completion_tokens=12 ttft_s=0.041 gen_s=0.210 finish=stop total_s=0.233

The id is also the response's `X-Request-ID` header (a caller's own id of up to 64
letters, digits, `-`, `_` and `.` is kept, so a proxy's id follows the request).
`user` is the account's name or `local`; `key` is the id of the API key used,
never the key. Routes that generate text name the model and hand over the
engine's `Stream` (`note_generation`); its record gives the tokens and timings
once the response has been sent, so the engine never learns about HTTP.

Deliberately never logged: message text, the query string, cookies, headers,
keys or passwords. At debug level (`serge serve --log-level debug`) the query
string is added, for a developer on their own machine; health probes and metrics
scrapes (`PROBES`, every few seconds from a balancer or a page) are logged at debug level only. A request whose hosted tools
(`web_search`, ...) were left out of what the model was offered names them (`tools_left_out=`).
"""

from __future__ import annotations

import logging
import re
import time
import uuid

from fastapi import Request

from serge.engine import Stream
from serge.web.http.asgi import HttpMiddleware
from serge.web.http.context import context, context_of

log = logging.getLogger("serge.requests")

HEADER = b"x-request-id"
PROBES = frozenset({"/api/health", "/metrics"})  # a balancer's, a page's or a scraper's every few seconds: debug level
_CALLER_ID = re.compile(rb"[A-Za-z0-9._-]{1,64}")
_BARE = re.compile(r"[A-Za-z0-9._:/@+-]+")


def note_generation(request: Request, model: str, stream: Stream, *more: Stream) -> None:
    """Tell the request log which model answered and where its tokens and timings will be (the first stream's),
    and the usage meter every stream whose tokens the client is told of (`more`: a request of several prompts)."""
    noted = context(request)
    noted.model, noted.log_stream = model, stream
    noted.streams += [stream, *more]


def note_embedding(request: Request, model: str, prompt_tokens: int) -> None:
    """Tell the request log and the usage meter which model embedded, and the tokens the client was told of."""
    noted = context(request)
    noted.model, noted.embedded = model, prompt_tokens


def note_tools_left_out(request: Request, types: list[str]) -> None:
    """Name the tools a request offered that its model was not (hosted tools Serge cannot run)."""
    if types:
        context(request).tools_left_out = ",".join(sorted(set(types)))


def _value(value: object) -> str:
    text = f"{value:.3f}" if isinstance(value, float) else str(value)
    return text if _BARE.fullmatch(text) else '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def logfmt(fields: dict[str, object]) -> str:
    return " ".join(f"{k}={_value(v)}" for k, v in fields.items() if v is not None)


class RequestLog(HttpMiddleware):
    """Pure ASGI, outermost: it sees every answer, refusals by the guard and the throttle included."""

    async def http(self, scope, receive, send):
        given = dict(scope["headers"]).get(HEADER, b"")
        request_id = given.decode() if _CALLER_ID.fullmatch(given) else uuid.uuid4().hex[:16]
        started = time.monotonic()
        status = 500  # what the client gets when the app fails before answering

        async def send_with_id(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", []), (HEADER, request_id.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            self._write(scope, request_id, status, time.monotonic() - started)

    @staticmethod
    def _write(scope, request_id: str, status: int, total_s: float) -> None:
        noted = context_of(scope)
        user = noted.user
        fields: dict[str, object] = {
            "id": request_id, "method": scope["method"], "path": scope["path"], "status": status,
            "user": user.name if user is not None else "-", "key": noted.key_id,
            "model": noted.model, "tools_left_out": noted.tools_left_out,
        }
        stream: Stream | None = noted.log_stream
        records = stream.records if stream is not None and stream.done else ()  # not done: the client left
        if records:
            record = records[0]  # and n > 1 choices' tokens together
            fields.update(prompt_tokens=record.prompt_tokens, completion_tokens=sum(r.completion_tokens for r in records),
                          ttft_s=record.ttft_s, gen_s=record.duration_s, finish=record.finish_reason.value,
                          choices=len(records) if len(records) > 1 else None)
        fields["total_s"] = total_s
        if log.isEnabledFor(logging.DEBUG) and scope.get("query_string"):
            fields["query"] = scope["query_string"].decode("latin-1")
        # a balancer's or a page's health probes, and metrics scrapes, every few seconds: shown at debug level
        log.log(logging.DEBUG if scope["path"] in PROBES else logging.INFO, "request %s", logfmt(fields))
