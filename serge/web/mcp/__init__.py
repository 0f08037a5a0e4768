"""Serge as an MCP server at `/mcp`: a user's own knowledge and chats, offered to other agents."""

from serge.web.mcp.server import McpEndpoint, install_mcp

__all__ = ["McpEndpoint", "install_mcp"]
