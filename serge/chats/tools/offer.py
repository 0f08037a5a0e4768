"""Which tools a turn offers, by the name the model calls each, and which of them wait for approval.

The chat page offers the tools of the servers a chat ticks (`function_names`); the Responses API
the tools of the servers a request's `mcp` tools name, filtered as OpenAI's tool says (`McpUse`,
`catalog`). Both end in `OfferedTool`s, the one shape the turn (turn.py) reads. Listing a server's
tools is `ToolServers`' job; who may use which server is decided there too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from serge.engine import Tool
from serge.tools import ToolServers, ToolServerUnreachable, ToolSpec

KNOWLEDGE_SERVER = "serge"  # the server name shown for Serge's own `search_knowledge`
DESCRIPTION_CHARS = 4000  # of a tool's description, in the prompt: a server's essay is not the model's to read

SEARCH_KNOWLEDGE = ToolSpec(
    server=KNOWLEDGE_SERVER, name="search_knowledge",
    description="Search the files and knowledge collections of this chat; returns the best passages with their "
                "file and page.",
    input_schema={"type": "object", "properties": {
        "query": {"type": "string", "description": "what to look for"},
        "limit": {"type": "integer", "minimum": 1, "maximum": 10, "description": "passages wanted (5 if left out)"},
    }, "required": ["query"]},
    read_only=True)


@dataclass(frozen=True)
class OfferedTool:
    """A tool the model may call, and whether a call of it waits for an approval first."""

    spec: ToolSpec
    needs_approval: bool

    @property
    def server(self) -> str:
        return self.spec.server

    @property
    def key(self) -> str:
        """How an "always allow" names it."""
        return f"{self.spec.server}/{self.spec.name}"

    def as_function(self, name: str) -> Tool:
        return Tool(name, self.spec.description[:DESCRIPTION_CHARS], json.dumps(self.spec.input_schema))


def function_names(specs: Sequence[ToolSpec]) -> dict[str, OfferedTool]:
    """A chat's tools by the name the model calls each: its own, or `server_tool` where two servers share a name;
    a tool that is not read-only waits for approval."""
    counts: dict[str, int] = {}
    for spec in specs:
        counts[spec.name] = counts.get(spec.name, 0) + 1
    named = {}
    for spec in specs:
        name = spec.name if counts[spec.name] == 1 else f"{spec.server}_{spec.name}"
        named[name[:64]] = OfferedTool(spec, not spec.read_only)
    return named


@dataclass(frozen=True)
class ToolFilter:
    """Tools by name and by their read-only annotation; a criterion left out matches every tool."""

    names: frozenset[str] | None = None
    read_only: bool | None = None

    def matches(self, spec: ToolSpec) -> bool:
        return ((self.names is None or spec.name in self.names)
                and (self.read_only is None or spec.read_only == self.read_only))


@dataclass(frozen=True)
class McpUse:
    """One registered server a request offers the model: which of its tools, and which wait for approval (those
    `always` matches, else all but those `never` matches when `approve_all`, else none)."""

    server: str
    allowed: ToolFilter | None = None  # None: every tool of the server
    approve_all: bool = True
    always: ToolFilter | None = None
    never: ToolFilter | None = None

    def offers(self, spec: ToolSpec) -> bool:
        return self.allowed is None or self.allowed.matches(spec)

    def needs_approval(self, spec: ToolSpec) -> bool:
        if self.always is not None and self.always.matches(spec):
            return True
        if self.never is not None and self.never.matches(spec):
            return False
        return self.approve_all


@dataclass(frozen=True)
class Listing:
    """A server's tools as listed for this turn; `fresh`: listed now, not taken from the conversation."""

    server: str
    tools: tuple[ToolSpec, ...]
    error: str | None = None
    fresh: bool = True


class ToolNameClash(ValueError):
    """Two offered tools (of two servers, or a server's and a function) share a name the model would call."""


async def list_tools(servers: ToolServers, uses: Sequence[McpUse],
                     earlier: dict[str, tuple[ToolSpec, ...]]) -> list[Listing]:
    """Each server's tools: as the conversation listed them already (`earlier`), else asked of the server now.
    A server that cannot be reached is a listing with its error, and offers nothing."""
    found = []
    for use in uses:
        if use.server in earlier:
            found.append(Listing(use.server, earlier[use.server], fresh=False))
            continue
        try:
            found.append(Listing(use.server, tuple(await servers.tools(use.server))))
        except ToolServerUnreachable as exc:
            found.append(Listing(use.server, (), error=exc.message))
    return found


def catalog(uses: Sequence[McpUse], listings: Sequence[Listing], taken: Sequence[str]) -> dict[str, OfferedTool]:
    """The tools offered, by the name the model calls them; `taken`: the client's own functions' names."""
    by_server = {u.server: u for u in uses}
    offered: dict[str, OfferedTool] = {}
    for listing in listings:
        use = by_server[listing.server]
        for spec in listing.tools:
            if not use.offers(spec):
                continue
            if spec.name in offered or spec.name in taken:
                other = offered[spec.name].server if spec.name in offered else "a function tool"
                raise ToolNameClash(f"the tool {spec.name!r} of {listing.server!r} has the name of one of {other}'s; "
                                    "leave one out with allowed_tools")
            offered[spec.name] = OfferedTool(spec, use.needs_approval(spec))
    return offered
