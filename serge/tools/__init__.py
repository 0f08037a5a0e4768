"""MCP tools run by Serge: the registered servers, their sessions, and the values handed to callers.

`ToolServers` (one per app, in its `Services`) is the only owner of MCP client sessions,
through the official `mcp` SDK; everything else names a server by its registered name.
It knows nothing of HTTP nor of chats.
"""

from serge.tools.servers import ToolServers, check_registration
from serge.tools.specs import (ToolOutcome, ToolServerCheckFailed, ToolServerError, ToolServerForbidden,
                               ToolServerNotFound, ToolServerUnreachable, ToolSpec)

__all__ = ["ToolOutcome", "ToolServerCheckFailed", "ToolServerError", "ToolServerForbidden", "ToolServerNotFound",
           "ToolServerUnreachable", "ToolServers", "ToolSpec", "check_registration"]
