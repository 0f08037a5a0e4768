"""The Responses API's MCP items and their stream events, as a reply's deltas and its calls make them.

`McpOutputItems` is `OutputItems` (output.py) that knows which tool names are MCP servers' tools:
a call of one becomes an `mcp_call` item (Serge runs it: `response.mcp_call.in_progress`,
`response.mcp_call_arguments.delta`/`.done`, `response.mcp_call.completed`/`.failed`) or, when it
needs approval, an `mcp_approval_request` item; a server's listing is an `mcp_list_tools` item
(`response.mcp_list_tools.in_progress`, `.completed`/`.failed`). Calls of the client's own
functions stay `function_call` items. Nothing here runs a call (serge.chats.tools' `ToolTurn` does).
"""

from __future__ import annotations

from serge.chats.tools import CallDone, CallRunning, Listing, OfferedTool, approval_id
from serge.engine import Delta, GenerationRecord, ToolCall
from serge.web.responses.items import new_id
from serge.web.responses.output import OutputItems, status_of


def listing_item(listing: Listing) -> dict:
    item = {"type": "mcp_list_tools", "id": new_id("mcpl"), "server_label": listing.server,
            "tools": [{"name": s.name, "description": s.description, "input_schema": s.input_schema,
                       "annotations": {"read_only": s.read_only}} for s in listing.tools]}
    if listing.error:
        item["error"] = listing.error
    return item


class McpOutputItems(OutputItems):
    """`OutputItems` that writes a call of an MCP tool as an `mcp_call` item (run by Serge) or, when it needs
    approval, an `mcp_approval_request` item, instead of a `function_call` for the client."""

    def __init__(self, logprobs: bool, tools: dict[str, OfferedTool]) -> None:
        super().__init__(logprobs)
        self.tools = tools
        self._mcp: dict[int, dict] = {}  # this pass's call index -> its mcp_call or approval item
        self._by_call: dict[str, dict] = {}  # the engine's call id -> its item
        self._unnamed: list[dict] = []  # items of calls whose id the stream did not say, oldest first

    def next_pass(self) -> list[dict]:
        """A new generation pass: its calls are counted from 0 again."""
        events = self._close_message("completed") + self._close_thought("completed") + self._close_call()
        self._calls, self._mcp = {}, {}
        return events

    def listed(self, listing: Listing) -> list[dict]:
        item = listing_item(listing)
        self.output.append(item)
        index = self._index(item)
        done = "failed" if listing.error else "completed"
        return [{"type": "response.output_item.added", "output_index": index,
                 "item": {**item, "tools": [], "error": None}},
                {"type": "response.mcp_list_tools.in_progress", "item_id": item["id"], "output_index": index},
                {"type": f"response.mcp_list_tools.{done}", "item_id": item["id"], "output_index": index},
                {"type": "response.output_item.done", "output_index": index, "item": item}]

    def add(self, delta: Delta) -> list[dict]:
        theirs, events = [], []
        for piece in delta.tool_calls:
            item = self._mcp.get(piece.index)
            if item is None and piece.index not in self._calls and piece.name in self.tools:
                events += self._close_message("completed") + self._close_thought("completed") + self._close_call()
                item = self._open_mcp(piece.id, piece.name)
                self._mcp[piece.index] = item
                if item["type"] == "mcp_call":
                    index = self._index(item)
                    events += [{"type": "response.output_item.added", "output_index": index, "item": {**item}},
                               {"type": "response.mcp_call.in_progress", "item_id": item["id"],
                                "output_index": index}]
            if item is None:
                theirs.append(piece)
            elif piece.arguments:
                item["arguments"] += piece.arguments
                if item["type"] == "mcp_call":
                    events.append({"type": "response.mcp_call_arguments.delta", "item_id": item["id"],
                                   "output_index": self._index(item), "delta": piece.arguments})
        rest = Delta(delta.text, delta.tokens, tuple(theirs), delta.reasoning, delta.choice)
        return events + (super().add(rest) if rest or not delta else [])

    def _open_mcp(self, call_id: str | None, name: str) -> dict:
        tool = self.tools[name]
        if tool.needs_approval:
            item = {"type": "mcp_approval_request", "id": approval_id(call_id) if call_id else new_id("mcpr"),
                    "server_label": tool.server,
                    "name": name, "arguments": ""}
        else:
            item = {"type": "mcp_call", "id": call_id or new_id("mcp"), "server_label": tool.server,
                    "name": name, "arguments": "", "status": "in_progress", "output": None, "error": None,
                    "approval_request_id": None}
        self.output.append(item)
        if call_id is not None:
            self._by_call[call_id] = item
        else:  # a remote model's server may leave a call's id out: the record names it, matched by order
            self._unnamed.append(item)
        return item

    def _item_of(self, call: ToolCall) -> dict | None:
        """The item this pass opened for `call`, if any."""
        if call.id not in self._by_call:
            match = next((i for i in self._unnamed if i["name"] == call.name), None)
            if match is None:
                return None
            self._unnamed.remove(match)
            self._by_call[call.id] = match
        return self._by_call[call.id]

    def running(self, event: CallRunning) -> list[dict]:
        """A call about to run: its arguments are whole now (or, approved in this request, its item opens)."""
        item = self._item_of(event.call)
        if item is None:  # approved in this request: the call was asked for in an earlier response
            item = {"type": "mcp_call", "id": new_id("mcp"), "server_label": event.tool.server,
                    "name": event.call.name, "arguments": event.call.arguments, "status": "in_progress",
                    "output": None, "error": None, "approval_request_id": event.approval_id}
            self.output.append(item)
            self._by_call[event.call.id] = item
            index = self._index(item)
            return [{"type": "response.output_item.added", "output_index": index, "item": {**item}},
                    {"type": "response.mcp_call.in_progress", "item_id": item["id"], "output_index": index},
                    {"type": "response.mcp_call_arguments.done", "item_id": item["id"], "output_index": index,
                     "arguments": item["arguments"]}]
        return [{"type": "response.mcp_call_arguments.done", "item_id": item["id"],
                 "output_index": self._index(item), "arguments": item["arguments"]}]

    def called(self, event: CallDone) -> list[dict]:
        item = self._item_of(event.call)
        if item is None:  # a call of no tool offered: the model is told, the client sees nothing of it
            return []
        outcome = event.outcome
        if outcome.is_error:
            item["status"], item["error"] = "failed", {"type": "mcp_tool_execution_error",
                                                       "content": [{"type": "text", "text": outcome.text}]}
        else:
            item["status"], item["output"] = "completed", outcome.text
        index = self._index(item)
        return [{"type": f"response.mcp_call.{item['status']}", "item_id": item["id"], "output_index": index},
                {"type": "response.output_item.done", "output_index": index, "item": item}]

    def asked(self, call: ToolCall) -> list[dict]:
        item = self._item_of(call)
        item["arguments"] = call.arguments or item["arguments"]
        index = self._index(item)
        return [{"type": "response.output_item.added", "output_index": index, "item": item},
                {"type": "response.output_item.done", "output_index": index, "item": item}]

    def finish(self, record: GenerationRecord) -> list[dict]:
        if any(i["type"] in ("mcp_call", "mcp_approval_request") for i in self.output):
            # a turn that called tools or asks to: no empty message is made up after its calls
            status = status_of(record)
            events = self._close_thought(status) + self._close_call(status) + self._close_message(status)
            for item in self.output:
                if item["type"] == "mcp_call" and item["status"] == "in_progress":  # cut while it was written
                    item["status"] = "incomplete"
                    events.append({"type": "response.output_item.done", "output_index": self._index(item),
                                   "item": item})
            return events
        return super().finish(record)
