"""The Responses API's `mcp` tool: OpenAI's request shapes and items over Serge's registered MCP servers.

A request names a server only by its registered name (`server_label`); a `server_url` that is
not the registered one is a 400, and nothing a request sends (a URL, headers, a token, a
connector) reaches a server or is fetched. The user must be allowed the server (`ToolServers.check`).
This module reads the tool (`McpToolIn`, `McpChoice`, into `McpUse`) and reads earlier listings
and approvals back out of a conversation's items; `mcp_output` writes the items and events. The
turn that runs the calls is `serge.chats.tools`' one `ToolTurn`, the chat page's too.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from serge.chats.tools import Approved, McpUse, ToolFilter
from serge.engine import ToolCall
from serge.store import UserRecord
from serge.tools import ToolServerError, ToolServers, ToolSpec
from serge.web.http.dialects import StrictRequest
from serge.web.http.errors import ApiError
from serge.web.openai.chat_models import NO_EFFECT
from serge.web.responses.items import invalid

MAX_MCP_TOOLS = 8  # servers in one request
REFUSED_FIELDS = ("headers", "authorization", "connector_id", "tunnel_id")


class McpFilter(StrictRequest):
    tool_names: list[str] | None = Field(None, max_length=256)
    read_only: bool | None = Field(None, description="Tools whose MCP annotations say they only read (or not).")

    def filter(self) -> ToolFilter:
        return ToolFilter(frozenset(self.tool_names) if self.tool_names is not None else None, self.read_only)


class ApprovalFilter(StrictRequest):
    always: McpFilter | None = None
    never: McpFilter | None = None


class McpToolIn(StrictRequest):
    """OpenAI's MCP tool, for a server registered in Serge (`serge mcp add`) under `server_label`."""

    type: Literal["mcp"]
    server_label: str = Field(max_length=64, description="The registered server's name.")
    server_url: str | None = Field(None, max_length=2048, description=(
        "Optional; if given, it must be the registered server's URL (else a 400). Serge never connects to a URL "
        "a request names."))
    allowed_tools: Annotated[list[str], Field(max_length=256)] | McpFilter | None = Field(None, description=(
        "The server's tools the model is offered: names, or a filter; all if left out."))
    require_approval: Literal["always", "never"] | ApprovalFilter | None = Field(None, description=(
        "always (the default), never, or {always: filter, never: filter}: a call that needs approval ends the "
        "response with an mcp_approval_request item; answer it with an mcp_approval_response input item."))
    server_description: str | None = Field(None, max_length=10_000, description=NO_EFFECT)
    allowed_callers: list[str] | None = Field(None, max_length=8, description=NO_EFFECT)
    defer_loading: bool | None = Field(None, description=NO_EFFECT)
    headers: dict | None = Field(None, description="Refused: a registered server gets the headers its admin set.")
    authorization: str | None = Field(None, description="Refused, as headers.")
    connector_id: str | None = Field(None, description="Refused: Serge has no connectors.")
    tunnel_id: str | None = Field(None, description="Refused: Serge has no tunnels.")

    def use(self, index: int) -> McpUse:
        for name in REFUSED_FIELDS:
            if getattr(self, name) is not None:
                raise invalid(f"tools.{index}.{name}: Serge sends a registered server only what its admin "
                              "registered; leave it out", f"tools.{index}.{name}")
        allowed = self.allowed_tools
        allowed = ToolFilter(frozenset(allowed)) if isinstance(allowed, list) else allowed.filter() if allowed \
            else None
        approval = self.require_approval
        if isinstance(approval, ApprovalFilter):
            return McpUse(self.server_label, allowed, True, approval.always.filter() if approval.always else None,
                          approval.never.filter() if approval.never else None)
        return McpUse(self.server_label, allowed, approval != "never")

    def echo(self) -> dict:
        return self.model_dump(exclude_none=True, include={"type", "server_label", "server_url", "allowed_tools",
                                                           "require_approval", "server_description"})


class McpChoice(StrictRequest):
    """tool_choice {type: mcp, server_label, name}: the first pass must call that server's tool (any of its tools
    when name is left out)."""

    type: Literal["mcp"]
    server_label: str = Field(max_length=64)
    name: str | None = Field(None, max_length=128)


def checked_uses(tools: list[McpToolIn], servers: ToolServers | None, user: UserRecord) -> list[McpUse]:
    """The request's MCP tools as uses of servers this user may use; a 400 or 403 saying what is wrong."""
    if not tools:
        return []
    if servers is None:
        raise ApiError(400, "this Serge runs no MCP servers", code="invalid_value", param="tools")
    if len(tools) > MAX_MCP_TOOLS:
        raise invalid(f"tools has {len(tools)} mcp tools; the limit is {MAX_MCP_TOOLS}", "tools")
    labels = [t.server_label for t in tools]
    if len(set(labels)) != len(labels):
        raise invalid("two mcp tools name the same server_label", "tools")
    try:
        servers.check(user, labels)
    except ToolServerError as exc:
        raise ApiError(exc.status, f"tools: {exc.message}", code="mcp_server_refused", param="tools") from None
    uses = []
    for tool in tools:
        index = next(i for i, t in enumerate(tools) if t is tool)
        registered = servers.store.get(tool.server_label)
        if tool.server_url is not None and (registered is None or registered.url is None
                                            or tool.server_url.rstrip("/") != registered.url.rstrip("/")):
            raise invalid(f"tools.{index}.server_url is not the URL of the server registered as "
                          f"{tool.server_label!r}; name a registered server by its server_label alone: Serge "
                          "connects to no URL a request names", f"tools.{index}.server_url")
        uses.append(tool.use(index))
    return uses


# --- reading a conversation back ----------------------------------------------------------------------
def _spec(server: str, tool: dict) -> ToolSpec:
    annotations = tool.get("annotations") or {}
    return ToolSpec(server, tool["name"], tool.get("description") or "", tool.get("input_schema") or {},
                    bool(annotations.get("read_only")))


def earlier_listings(items: list[dict]) -> dict[str, tuple[ToolSpec, ...]]:
    """The tools each server was listed with in the conversation so far (the last listing wins), so a
    continued conversation does not list them again, as OpenAI's does not."""
    return {i["server_label"]: tuple(_spec(i["server_label"], t) for t in i["tools"])
            for i in items if i["type"] == "mcp_list_tools" and not i.get("error")}


def approvals(history: list[dict], items: list[dict]) -> list[Approved]:
    """The approval requests this request's input answers, each with the call it asked about."""
    asked = {i["id"]: i for i in (*history, *items) if i["type"] == "mcp_approval_request"}
    done = {i.get("approval_request_id") for i in (*history, *items) if i["type"] == "mcp_call"}
    found = []
    for item in items:
        if item["type"] != "mcp_approval_response" or item["approval_request_id"] in done:
            continue
        request = asked.get(item["approval_request_id"])
        if request is None:
            raise invalid(f"mcp_approval_response answers {item['approval_request_id']!r}, which is no approval "
                          "request of this conversation", "input")
        found.append(Approved(ToolCall(request["id"], request["name"], request["arguments"]), item["approve"],
                              request["id"]))
    return found
