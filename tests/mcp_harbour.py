"""A small MCP server over stdio, written with the `mcp` SDK, for the tests of Serge's MCP tools: `tide` only
reads (annotated so), `ring_bell` is not said to (so it waits for approval by the annotations' default)."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

server = MCPServer("harbour")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True, destructiveHint=False))
def tide(place: str) -> str:
    """When high water is at a place."""
    return f"High water at {place} is at noon."


@server.tool()
def ring_bell(times: int) -> str:
    """Ring the harbour bell."""
    return f"The bell rang {times} times."


if __name__ == "__main__":
    server.run()
