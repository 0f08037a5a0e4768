"""The MCP server registry: the servers an admin registered, by name, kept in the database.

A listing (`ToolServerRecord`) carries the names of a server's headers and environment
variables, never their values, which may be secrets; only `connection()` returns them,
for the one part that connects (`serge.tools`). Nothing here checks who may register a
server or starts one: that is the CLI's and the admin page's, and `serge.tools`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError

from serge.store.db import Database
from serge.store.tables import McpServer


class ToolServerExists(ValueError):
    """A server of that name is already registered."""


class ToolServerMissing(LookupError):
    """No server of that name is registered."""


@dataclass(frozen=True)
class ToolServerRecord:
    """A registered server as anyone may see it: no header value, no environment value."""

    name: str
    command: tuple[str, ...] | None  # a stdio server's argv
    url: str | None  # a streamable-HTTP server's
    header_names: tuple[str, ...]
    env_names: tuple[str, ...]
    admins_only: bool
    created_at: datetime

    @property
    def transport(self) -> str:
        return "stdio" if self.command else "http"

    @classmethod
    def of(cls, row: McpServer) -> ToolServerRecord:
        return cls(name=row.name, command=tuple(row.command) if row.command else None, url=row.url,
                   header_names=tuple(sorted(row.headers or {})), env_names=tuple(sorted(row.env or {})),
                   admins_only=row.admins_only, created_at=row.created_at)


def _host_of(url: str | None) -> str | None:
    """A URL without what may be secret in it (a password, a query), for a repr."""
    return None if url is None else url.split("?")[0].split("#")[0].rsplit("@", 1)[-1]


@dataclass(frozen=True)
class ToolServerConnection:
    """What it takes to connect: secrets included. Its repr hides them, so a log line never shows one."""

    name: str
    command: tuple[str, ...] | None
    url: str | None
    headers: tuple[tuple[str, str], ...]
    env: tuple[tuple[str, str], ...]

    def __repr__(self) -> str:
        return (f"ToolServerConnection(name={self.name!r}, command={self.command!r}, url={_host_of(self.url)!r}, "
                f"headers={[k for k, _ in self.headers]}, env={[k for k, _ in self.env]})")

    __str__ = __repr__


class ToolServerStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def add(self, name: str, *, command: Sequence[str] | None = None, url: str | None = None,
            headers: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None,
            admins_only: bool = False) -> ToolServerRecord:
        if (command is None) == (url is None):
            raise ValueError("a server has either a command or a URL")
        row = McpServer(name=name, command=list(command) if command else None, url=url,
                        headers=dict(headers or {}), env=dict(env or {}), admins_only=admins_only)
        try:
            with self.db.session() as s, s.begin():
                s.add(row)
                s.flush()
                return ToolServerRecord.of(row)
        except IntegrityError:
            raise ToolServerExists(f"a server named {name!r} is already registered; remove it first") from None

    def remove(self, name: str) -> None:
        with self.db.session() as s, s.begin():
            if not s.execute(delete(McpServer).where(McpServer.name == name)).rowcount:
                raise ToolServerMissing(f"no server named {name!r} is registered")

    def list(self) -> list[ToolServerRecord]:
        with self.db.session() as s:
            return [ToolServerRecord.of(r) for r in s.scalars(select(McpServer).order_by(McpServer.name))]

    def get(self, name: str) -> ToolServerRecord | None:
        with self.db.session() as s:
            row = s.get(McpServer, name)
            return ToolServerRecord.of(row) if row else None

    def connection(self, name: str) -> ToolServerConnection | None:
        with self.db.session() as s:
            row = s.get(McpServer, name)
            if row is None:
                return None
            return ToolServerConnection(name=row.name, command=tuple(row.command) if row.command else None,
                                        url=row.url, headers=tuple(sorted((row.headers or {}).items())),
                                        env=tuple(sorted((row.env or {}).items())))
