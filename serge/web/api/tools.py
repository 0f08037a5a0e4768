"""Tools over HTTP: `/api/tools` (the servers a user may tick in a chat, with their tools) and `/api/mcp/servers`
(admins: list, register, remove MCP servers). HTTP only.

A stdio server's command never comes from a request: it is registered on the server's own
machine with `serge mcp add NAME -- COMMAND`; here an admin registers a streamable-HTTP
URL only. Header values are never sent back: a listing names the headers.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from serge.chats.tools import KNOWLEDGE_SERVER, SEARCH_KNOWLEDGE
from serge.tools.secrets import shown_url
from serge.store import ToolServerRecord
from serge.tools import ToolServerCheckFailed, ToolServerError, ToolServers, ToolSpec
from serge.web.http.auth import admins_only, current_user
from serge.web.http.context import services

router = APIRouter(tags=["tools"])
ADMIN = admins_only("manage tool servers")


class ServerIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=40, description="What chats call it: lowercase letters, digits, - and _.")
    url: str = Field(max_length=2000, description="The streamable-HTTP endpoint (an SSE one is tried if refused). "
                                                  "A stdio server is added on the server: `serge mcp add NAME -- "
                                                  "COMMAND`.")
    headers: dict[Annotated[str, Field(max_length=100)], Annotated[str, Field(max_length=4000)]] = Field(
        default_factory=dict, max_length=32, description="Sent with every request to it; never shown again.")
    admins_only: bool = Field(False, description="Only admins may use it.")
    check: bool = Field(True, description="First connect and list its tools (within 15 s); if that fails, answer "
                                          "422 `tool_server_unreachable` and keep nothing. false: save it anyway.")


def servers(request: Request) -> ToolServers:
    return services(request).tools



def server_out(record: ToolServerRecord) -> dict:
    return {"name": record.name, "transport": record.transport,
            "command": list(record.command) if record.command else None,
            "url": shown_url(record.url) if record.url else None,
            "headers": list(record.header_names), "env": list(record.env_names), "admins_only": record.admins_only,
            "created_at": record.created_at.isoformat()}


def tool_out(spec: ToolSpec) -> dict:
    return {"name": spec.name, "description": spec.description, "read_only": spec.read_only,
            "input_schema": spec.input_schema}


@router.get("/api/tools", summary="The tool servers you may tick in a chat, with their tools (or why one cannot "
                                  "be reached)")
async def usable_tools(request: Request):
    found = [{"name": KNOWLEDGE_SERVER, "title": "Knowledge search (the chat's files and collections)",
              "tools": [tool_out(SEARCH_KNOWLEDGE)], "error": None}]
    listed = await servers(request).listings(servers(request).usable(current_user(request)))
    for name, tools in listed.items():
        failed = isinstance(tools, ToolServerError)
        found.append({"name": name, "title": name, "tools": [] if failed else [tool_out(t) for t in tools],
                      "error": tools.message if failed else None})
    return {"servers": found}


@router.get("/api/mcp/servers", dependencies=[ADMIN],
            summary="The registered MCP servers (admins only); header values are never shown")
def list_servers(request: Request):
    return {"servers": [server_out(r) for r in servers(request).registered()]}


@router.post("/api/mcp/servers", dependencies=[ADMIN],
             status_code=201, summary="Register a streamable-HTTP MCP server (admins only)")
async def add_server(body: ServerIn, request: Request):
    try:
        return server_out(await servers(request).add(body.name, url=body.url, headers=body.headers,
                                                     admins_only=body.admins_only, check=body.check))
    except ToolServerCheckFailed as exc:
        raise ToolServerCheckFailed(f'{exc.message} To save it anyway, send "check": false.', exc.param) from None


@router.delete("/api/mcp/servers/{name}", dependencies=[ADMIN],
               status_code=204, summary="Remove an MCP server, stopping it (admins only)")
async def remove_server(name: str, request: Request):
    await servers(request).unregister(name[:64])
