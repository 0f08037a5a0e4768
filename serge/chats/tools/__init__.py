"""Tools in replies: the one tool turn (turn.py), what it offers (offer.py), who approves a call (decisions.py),
and a chat's side of it (chat.py)."""

from serge.chats.tools.chat import ChatTools, ToolDelta, ToolReply, knowledge_search
from serge.chats.tools.decisions import ToolDecisions
from serge.chats.tools.offer import (KNOWLEDGE_SERVER, SEARCH_KNOWLEDGE, Listing, McpUse, OfferedTool, ToolFilter,
                                     ToolNameClash, catalog, function_names, list_tools)
from serge.chats.tools.turn import (AlreadyAnswered, ApprovalAsked, ApprovalWanted, Approved, CallDone, CallRunning,
                                    Generated, PassStarted, ToolTurn, TurnEnded, approval_id, run_approved)

__all__ = ["KNOWLEDGE_SERVER", "SEARCH_KNOWLEDGE", "AlreadyAnswered", "ApprovalAsked", "ApprovalWanted", "Approved",
           "CallDone", "CallRunning", "ChatTools", "Generated", "Listing", "McpUse", "OfferedTool", "PassStarted",
           "ToolDecisions", "ToolDelta", "ToolFilter", "ToolNameClash", "ToolReply", "ToolTurn", "TurnEnded",
           "approval_id", "catalog", "function_names", "knowledge_search", "list_tools", "run_approved"]
