"""One registered MCP server's connection, through the official `mcp` SDK: started on first use, shared by
every caller, restarted with backoff when it dies.

The SDK's context managers must be entered and left in one task, so each connection is a
task of its own (`_run`) that enters the client, lists the tools, then serves calls from a
queue, each in a child task with its own cancel scope: a call that times out or whose
caller is stopped is cancelled there (the SDK tells the server), and the others go on. A
server that closes the connection (a crash) ends the task; every call in flight fails with
a message, and the next call starts the server again, after a pause that doubles with each
failure in a row. Nothing here knows who may use a server: `servers.ToolServers` checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import tempfile
import time
from dataclasses import dataclass, field

import anyio

from serge.store import ToolServerConnection
from serge.tools.secrets import secrets_of, without_secrets
from serge.tools.specs import ToolOutcome, ToolServerUnreachable, ToolSpec, cut_outcome, outcome_of, spec_of

log = logging.getLogger(__name__)

BACKOFF_FIRST_S = 0.5
BACKOFF_MOST_S = 30.0
MAX_TOOLS = 200  # a server listing more offers the model its first 200
CLOSE_WITHIN_S = 10.0


@dataclass(eq=False)
class _Call:
    tool: str
    arguments: dict
    future: asyncio.Future
    scope: anyio.CancelScope | None = None
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True
        if self.scope is not None:
            self.scope.cancel()


@dataclass(eq=False)
class _Connection:
    """One life of the server: from the start of `_run` to its end."""

    task: asyncio.Task | None = None
    ready: asyncio.Future | None = None
    calls: asyncio.Queue = field(default_factory=asyncio.Queue)
    over: bool = False  # the server closed it: new calls go to the next connection


class ServerSession:
    def __init__(self, connection: ToolServerConnection, *, timeout_s: float, concurrency: int,
                 output_chars: int, errlog=None) -> None:
        self.connection = connection
        self.errlog = errlog  # a stdio server's stderr (None: Serge's own)
        self.name = connection.name
        self.timeout_s, self.output_chars = timeout_s, output_chars
        self._limit = asyncio.Semaphore(concurrency)
        self._current: _Connection | None = None
        self._failures = 0  # in a row: starts that failed, connections that died
        self._retry_at = 0.0
        self._unreachable: str | None = None  # why the last start failed, while that is the last news of it
        self._secrets = _secrets(connection)

    # --- callers ------------------------------------------------------------------
    async def tools(self) -> list[ToolSpec]:
        """The tools; a server whose last start failed says so at once during its pause, not after it (a page
        listing several servers would wait for each)."""
        current = self._current
        down = current is None or current.over or current.task.done()
        if down and self._unreachable is not None and self._retry_at > time.monotonic():
            raise ToolServerUnreachable(self._unreachable)
        return await self._up()

    async def call(self, tool: str, arguments: dict) -> ToolOutcome:
        """Run one call; never raises for the server's faults: they come back as an error outcome."""
        try:
            async with asyncio.timeout(self.timeout_s):
                async with self._limit:
                    await self._up()
                    current = self._current
                    call = _Call(tool, arguments, asyncio.get_running_loop().create_future())
                    current.calls.put_nowait(call)
                    try:
                        return await asyncio.shield(call.future)
                    finally:
                        if not call.future.done():
                            call.cancel()
        except TimeoutError:
            return ToolOutcome(text=f"the tool {tool!r} of {self.name!r} did not answer within "
                                    f"{self.timeout_s:g} s and was stopped", is_error=True, cut=False)
        except ToolServerUnreachable as exc:
            return ToolOutcome(text=exc.message, is_error=True, cut=False)

    async def close(self) -> None:
        """Stop the server (its process, for stdio) and wait until it is gone."""
        current, self._current = self._current, None
        if current is None or current.task is None:
            return
        current.calls.put_nowait(None)
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(current.task), CLOSE_WITHIN_S)
        if not current.task.done():
            current.task.cancel()
            with contextlib.suppress(BaseException):
                await current.task

    # --- the connection's life ------------------------------------------------------
    async def _up(self) -> list[ToolSpec]:
        """The server's tools, starting it first when it is not running (after the backoff pause, if it failed)."""
        current = self._current
        if current is None or current.over or current.task.done():
            pause = self._retry_at - time.monotonic()
            if pause > 0:
                await asyncio.sleep(pause)
            current = self._current
            if current is None or current.over or current.task.done():  # no other caller started it meanwhile
                current = _Connection(ready=asyncio.get_running_loop().create_future())
                current.task = asyncio.get_running_loop().create_task(self._run(current), name=f"mcp-{self.name}")
                self._current = current
        return await asyncio.shield(current.ready)

    def _failed(self, reason: str) -> None:
        self._failures += 1
        self._retry_at = time.monotonic() + min(BACKOFF_MOST_S, BACKOFF_FIRST_S * 2 ** (self._failures - 1))

    async def _run(self, current: _Connection) -> None:
        ways = _clients(self.connection, self.errlog)
        try:
            for attempt, client_of in enumerate(ways):
                try:
                    async with client_of() as client:
                        with anyio.fail_after(self.timeout_s):
                            specs = await _list_tools(client, self.name)
                        current.ready.set_result(specs)
                        self._failures, self._unreachable = 0, None
                        async with anyio.create_task_group() as group:
                            while (call := await current.calls.get()) is not None:
                                group.start_soon(self._serve, client, call, current)
                            group.cancel_scope.cancel()
                    return
                except BaseException as exc:  # noqa: BLE001 - a failed server never takes Serge down
                    if isinstance(exc, asyncio.CancelledError) and self._current is not current:
                        raise  # closed by `close()`
                    if not current.ready.done() and attempt + 1 < len(ways):
                        continue  # not over streamable HTTP: try SSE
                    reason = without_secrets(_reason(exc), self._secrets)
                    self._failed(reason)
                    if not current.ready.done():
                        log.warning("MCP server %r could not be started: %s", self.name, reason)
                        self._unreachable = f"the tool server {self.name!r} could not be reached: {reason}"
                        current.ready.set_exception(ToolServerUnreachable(self._unreachable))
                    else:
                        log.warning("MCP server %r stopped: %s", self.name, reason)
                        self._unreachable = None
                    return
        finally:
            if not current.ready.done():
                current.ready.set_exception(ToolServerUnreachable(f"the tool server {self.name!r} was stopped"))
            if not current.ready.cancelled():
                current.ready.exception()  # retrieved: no "never retrieved" warning when nobody waited
            while not current.calls.empty():
                left = current.calls.get_nowait()
                if left is not None and not left.future.done():
                    left.future.set_result(ToolOutcome(text=f"the tool server {self.name!r} stopped before the "
                                                            f"call {left.tool!r} ran", is_error=True, cut=False))

    async def _serve(self, client, call: _Call, current: _Connection) -> None:
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED

        outcome = None
        try:
            with anyio.CancelScope() as scope:
                call.scope = scope
                if call.cancelled:
                    scope.cancel()
                result = await client.call_tool(call.tool, call.arguments)
                outcome = outcome_of(result, self.output_chars)
            if outcome is None:
                outcome = ToolOutcome(text=f"the call to {call.tool!r} was stopped", is_error=True, cut=False)
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                outcome = ToolOutcome(text=f"the tool server {self.name!r} closed the connection during the call "
                                           f"(it may have crashed); it is started again for the next call",
                                      is_error=True, cut=False)
                if not current.over:
                    current.over = True
                    current.calls.put_nowait(None)  # this connection is over
            else:
                outcome = cut_outcome(f"the tool {call.tool!r} failed: {without_secrets(exc.message, self._secrets)}",
                                      True, self.output_chars)
        except Exception as exc:  # noqa: BLE001 - the model is told, the reply goes on
            outcome = cut_outcome(f"the tool {call.tool!r} failed: {without_secrets(_reason(exc), self._secrets)}",
                                  True, self.output_chars)
        finally:
            if not call.future.done():
                call.future.set_result(outcome or ToolOutcome(
                    text=f"the tool server {self.name!r} stopped during the call", is_error=True, cut=False))


async def first_listing(connection: ToolServerConnection, *, within_s: float) -> list[ToolSpec]:
    """Connect, list the tools and leave, all within `within_s`: how a server is checked before it is kept.
    ToolServerUnreachable says why not, with the last line a stdio server wrote to its stderr, and no secret of the
    registration; a stdio server is stopped after."""
    with tempfile.TemporaryFile("w+", errors="replace") as errlog:
        ways = _clients(connection, errlog)
        try:
            with anyio.fail_after(within_s):
                for attempt, client_of in enumerate(ways):
                    try:
                        async with client_of() as client:
                            return await _list_tools(client, connection.name)
                    except Exception:  # noqa: BLE001 - said below, as the last way's failure
                        if attempt + 1 == len(ways):  # else not over streamable HTTP: try SSE
                            raise
        except Exception as exc:  # noqa: BLE001
            reason = f"it did not answer within {within_s:g} s" if isinstance(exc, TimeoutError) else _reason(exc)
            errlog.seek(0)
            said = [line.strip() for line in errlog.read()[-4000:].splitlines() if line.strip()]
            if said:
                reason += f"; it said: {said[-1][:300]}"
            raise ToolServerUnreachable(without_secrets(reason, _secrets(connection))) from None
    return []


def _secrets(connection: ToolServerConnection) -> tuple[str, ...]:
    """What its errors must never show: the URL's password and query values, header and environment values."""
    return secrets_of(connection.url, [v for _, v in (*connection.headers, *connection.env)])


def _clients(conn: ToolServerConnection, errlog) -> list:
    """The ways to connect, in order: a stdio server's one; a URL's streamable HTTP, then SSE."""
    from mcp import Client

    if conn.command:
        from mcp.client.stdio import StdioServerParameters

        command, *args = conn.command
        if command in ("python", "python3"):  # the Python Serge runs on, with the packages it has (mcp-server-time ...)
            command = sys.executable
        params = StdioServerParameters(command=command, args=args, env=dict(conn.env) or None)
        return [lambda: Client(_stdio(params, errlog or sys.stderr))]
    headers = dict(conn.headers)
    return [lambda: Client(_streamable_http(conn.url, headers)), lambda: Client(_sse(conn.url, headers))]


async def _list_tools(client, name: str) -> list[ToolSpec]:
    specs, cursor = [], None
    while len(specs) < MAX_TOOLS:
        listed = await client.list_tools(cursor=cursor)
        specs += [spec_of(name, t) for t in listed.tools]
        cursor = listed.next_cursor
        if not cursor:
            break
    return specs[:MAX_TOOLS]


def _http(headers: dict[str, str]):
    import httpx2

    return httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0))


@contextlib.asynccontextmanager
async def _stdio(params, errlog):
    from mcp.client.stdio import stdio_client

    async with stdio_client(params, errlog=errlog) as streams:
        yield streams


@contextlib.asynccontextmanager
async def _streamable_http(url: str, headers: dict[str, str]):
    from mcp.client.streamable_http import streamable_http_client

    async with _http(headers) as http, streamable_http_client(url, http_client=http) as streams:
        yield streams


@contextlib.asynccontextmanager
async def _sse(url: str, headers: dict[str, str]):
    from mcp.client.sse import sse_client

    async with sse_client(url, headers=headers) as streams:
        yield streams


def _reason(exc: BaseException) -> str:
    """One line saying why, from an exception the SDK or anyio may have wrapped in groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, ToolServerUnreachable):
        return exc.message
    if isinstance(exc, TimeoutError):
        return "it did not answer in time"
    if isinstance(exc, FileNotFoundError):
        return f"its command was not found ({exc.filename or exc})"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if type(exc).__name__ == "ConnectError":  # httpx's: refused, or no such host
        return f"nothing accepted a connection there ({text or 'refused'})"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
