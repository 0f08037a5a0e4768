"""`ToolServers`: the one owner of Serge's MCP client sessions, one per app, and the registry's rules.

It registers servers (names, commands and URLs checked here, kept by `serge.store.tools`; an
admin's `add` first lists the new server's tools, so one nothing answers at is refused),
says which a user may use (`usable`), lists a server's tools and runs calls through a
`ServerSession` per server, made on first use and shared by every chat. Registrations are
read from the database on each use, so `serge mcp add` / `rm` on a running server take effect
at the next call. The sessions live on the event loop that `start()` ran on; a chat reply's
thread reaches them through `call_from_thread`. It decides nothing about which tools a reply
may call or when: that is the chat service's loop (`serge.chats.tools`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from serge.store.people.audit import note
from serge.access import is_hidden
from serge.store import ToolServerConnection, ToolServerExists, ToolServerMissing, ToolServerRecord, ToolServerStore
from serge.tools.secrets import shown_url
from serge.tools.session import ServerSession, first_listing
from serge.tools.specs import (ToolOutcome, ToolServerCheckFailed, ToolServerError, ToolServerForbidden,
                               ToolServerNotFound, ToolServerUnreachable, ToolSpec)

if TYPE_CHECKING:
    from serge.store import UserRecord

NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")
RESERVED = frozenset({"serge"})  # the chat's own knowledge search, ticked like a server
MAX_ARGS = 64
MAX_ARG_CHARS = 4096
MAX_HEADERS = 32
HEADER_NAME = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")
CHECK_WITHIN_S = 15.0  # an admin waits this long at most for a new server to list its tools


class ToolServers:
    def __init__(self, store: ToolServerStore, *, timeout_s: float = 30.0, concurrency: int = 4,
                 output_chars: int = 20_000) -> None:
        self.store = store
        self.errlog = None  # where stdio servers' stderr goes (None: Serge's own stderr)
        self.timeout_s, self.concurrency, self.output_chars = timeout_s, concurrency, output_chars
        self._sessions: dict[str, ServerSession] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None

    @classmethod
    def of(cls, store: ToolServerStore, settings) -> ToolServers:
        return cls(store, timeout_s=settings.tool_timeout_s, concurrency=settings.tool_concurrency,
                   output_chars=settings.tool_output_chars)

    # --- life cycle ---------------------------------------------------------------
    async def start(self) -> None:
        """Bind to the running loop; servers start later, each on its first use."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()

    async def close(self) -> None:
        """Stop every server Serge started (their processes too) and wait until they are gone."""
        sessions, self._sessions = list(self._sessions.values()), {}
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)

    # --- the registry -------------------------------------------------------------
    def register(self, name: str, *, command: Sequence[str] | None = None, url: str | None = None,
                 headers: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None,
                 admins_only: bool = False) -> ToolServerRecord:
        """Keep a server (a stdio command or a URL); `ToolServerError` says what is wrong with it."""
        check_registration(name, command, url, headers or {}, env or {})
        try:
            added = self.store.add(name, command=command, url=url, headers=headers, env=env, admins_only=admins_only)
        except ToolServerExists as exc:
            raise ToolServerError(str(exc)) from None
        note(self.store.db, "tool_server.add", f"{name}{' (admins only)' if admins_only else ''}")  # never its secrets
        return added

    async def add(self, name: str, *, command: Sequence[str] | None = None, url: str | None = None,
                  headers: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None,
                  admins_only: bool = False, check: bool = True) -> ToolServerRecord:
        """Register a server as an admin does: first connect and list its tools (unless `check` is False), so one that
        nothing answers at is refused with why (`ToolServerCheckFailed`) instead of offered to users, and not kept."""
        check_registration(name, command, url, headers or {}, env or {})  # a bad one is said before any wait
        if check and self.store.get(name) is None:  # (a taken name too, by `register`)
            connection = ToolServerConnection(name=name, command=tuple(command) if command else None, url=url,
                                              headers=tuple((headers or {}).items()), env=tuple((env or {}).items()))
            try:
                await first_listing(connection, within_s=min(CHECK_WITHIN_S, self.timeout_s))
            except ToolServerUnreachable as exc:
                where, what = (f"at {shown_url(url)}", "URL") if url else (f"from `{' '.join(command)}`", "command")
                raise ToolServerCheckFailed(
                    f"{name!r} was not saved: Serge could not list its tools {where}: {exc.message}. Check that the "
                    f"server is running and that its {what} is right.", param="url" if url else "command") from None
        return self.register(name, command=command, url=url, headers=headers, env=env, admins_only=admins_only)

    async def unregister(self, name: str) -> None:
        try:
            self.store.remove(name)
        except ToolServerMissing as exc:
            raise ToolServerNotFound(str(exc)) from None
        note(self.store.db, "tool_server.remove", name)
        if session := self._sessions.pop(name, None):
            await session.close()

    def registered(self) -> list[ToolServerRecord]:
        return self.store.list()

    def usable(self, user: UserRecord | None) -> list[str]:
        """The registered servers this user may use: every server, or for an admin-only one, admins only; none shared
        only with groups they are not in (`serge.access`)."""
        admin = bool(user is not None and user.admin)
        return [s.name for s in self.store.list()
                if (admin or not s.admins_only) and not is_hidden("tool_server", s.name)]

    def check(self, user: UserRecord | None, names: Sequence[str]) -> list[str]:
        """`names` without repeats, each a registered server this user may use; else the error says which not."""
        allowed = set(self.usable(user))
        for name in names:
            if name in allowed:
                continue
            if not isinstance(name, str) or self.store.get(name) is None or is_hidden("tool_server", name):
                raise ToolServerNotFound(f"no tool server named {name!r} is registered; the servers you may use: "
                                         f"{', '.join(sorted(allowed)) or 'none'}")
            raise ToolServerForbidden(f"the tool server {name!r} is for admins only")
        return list(dict.fromkeys(names))

    # --- sessions -----------------------------------------------------------------
    def _session(self, server: str) -> ServerSession:
        connection = self.store.connection(server)
        if connection is None:
            raise ToolServerNotFound(f"no tool server named {server!r} is registered")
        session = self._sessions.get(server)
        if session is not None and session.connection != connection:  # registered again, differently
            asyncio.get_running_loop().create_task(session.close())
            session = None
        if session is None:
            session = ServerSession(connection, timeout_s=self.timeout_s, concurrency=self.concurrency,
                                    output_chars=self.output_chars, errlog=self.errlog)
            self._sessions[server] = session
        return session

    async def tools(self, server: str) -> list[ToolSpec]:
        """The server's tools (started first if need be); ToolServerUnreachable says why it cannot be reached."""
        return await self._session(server).tools()

    async def listings(self, servers: Sequence[str]) -> dict[str, list[ToolSpec] | ToolServerError]:
        """Each server's tools, or why it cannot list them, all asked at once: a slow server holds back no other."""
        async def listing(server: str) -> list[ToolSpec] | ToolServerError:
            try:
                return await self.tools(server)
            except ToolServerError as exc:
                return exc
        return dict(zip(servers, await asyncio.gather(*(listing(server) for server in servers))))

    async def call(self, server: str, tool: str, arguments: dict) -> ToolOutcome:
        """Run one call, bounded by SERGE_TOOL_TIMEOUT_S and the server's concurrency; the server's faults (a
        timeout, a crash, an error) come back as an outcome with `is_error`, never as an exception."""
        return await self._session(server).call(tool, arguments)

    # --- from a thread (a chat reply's) --------------------------------------------
    def submit(self, coroutine) -> concurrent.futures.Future:
        """Run a coroutine of this object on its loop, from another thread; cancel the future to stop it."""
        if self._loop is None or self._loop.is_closed():
            coroutine.close()
            raise ToolServerError("the tool servers are not running")
        if threading.get_ident() == self._loop_thread:  # waiting on it there would wait forever
            coroutine.close()
            raise RuntimeError("ToolServers.submit was called on its own event loop's thread; await the call")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)


def check_registration(name: str, command: Sequence[str] | None, url: str | None, headers: Mapping[str, str],
                       env: Mapping[str, str]) -> None:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ToolServerError(f"{name!r} is not a server name: use 1 to 40 lowercase letters, digits, - or _, "
                              f"starting with a letter or digit")
    if name in RESERVED:
        raise ToolServerError(f"{name!r} is Serge's own knowledge search; pick another name")
    if (not command) == (not url):
        raise ToolServerError("give a server either a command (stdio) or a URL (streamable HTTP), not both")
    if command:
        if len(command) > MAX_ARGS or any(not a or len(a) > MAX_ARG_CHARS or "\0" in a for a in command):
            raise ToolServerError(f"the command takes at most {MAX_ARGS} non-empty arguments of at most "
                                  f"{MAX_ARG_CHARS} characters")
    if url:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or len(url) > 2000:
            raise ToolServerError(f"{url!r} is not an http:// or https:// URL")
    if len(headers) > MAX_HEADERS or len(env) > MAX_HEADERS:
        raise ToolServerError(f"at most {MAX_HEADERS} headers and {MAX_HEADERS} environment variables")
    for key, value in headers.items():
        if not HEADER_NAME.fullmatch(key) or any(c in value for c in "\r\n\0"):
            raise ToolServerError(f"the header {key!r} has a bad name or value; write it as \"Name: value\"")
    for key, value in env.items():
        if not ENV_NAME.fullmatch(key) or "\0" in value:
            raise ToolServerError(f"the environment variable {key!r} has a bad name or value")
