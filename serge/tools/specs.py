"""The values `serge.tools` hands out: a tool as the model is offered it, a call's outcome, and the errors.

Typed and frozen, so nothing of the `mcp` SDK's own types leaves `serge.tools`. A tool is
read-only only when its MCP annotations say so (`readOnlyHint` true and `destructiveHint`
not true): a tool without annotations may write, so it waits for the user's approval. That
is the MCP specification's own default (`readOnlyHint` false, `destructiveHint` true).
"""

from __future__ import annotations

from dataclasses import dataclass


class ToolServerError(Exception):
    """Something about a registered MCP server the caller should tell its user; `status` is the HTTP status the web
    layer answers with, `param` the request field at fault where one is."""

    status = 400

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param = message, param


class ToolServerNotFound(ToolServerError):
    """No server of that name is registered."""

    status = 400


class ToolServerForbidden(ToolServerError):
    """The server is registered for admins only."""

    status = 403


class ToolServerUnreachable(ToolServerError):
    """The server could not be started or reached, or did not answer."""

    status = 502


class ToolServerCheckFailed(ToolServerError):
    """A server being registered did not list its tools: nothing was kept. `param` names what to fix."""

    status = 422


@dataclass(frozen=True)
class ToolSpec:
    server: str
    name: str
    description: str
    input_schema: dict
    read_only: bool  # False unless the annotations say read-only and not destructive


@dataclass(frozen=True)
class ToolOutcome:
    text: str  # what the model is given: the tool's text content, or why the call failed
    is_error: bool  # the tool said it failed, or the call timed out, was stopped or lost its server
    cut: bool  # the output was longer than SERGE_TOOL_OUTPUT_CHARS and was cut (the text says so)


def read_only(annotations) -> bool:
    """The MCP annotations' verdict, with no annotation meaning "may write"."""
    if annotations is None:
        return False
    return bool(getattr(annotations, "read_only_hint", None)) and not getattr(annotations, "destructive_hint", None)


def spec_of(server: str, tool) -> ToolSpec:
    """A ToolSpec from the SDK's `Tool`."""
    schema = tool.input_schema if isinstance(tool.input_schema, dict) else {}
    return ToolSpec(server=server, name=tool.name, description=tool.description or "",
                    input_schema=schema or {"type": "object", "properties": {}}, read_only=read_only(tool.annotations))


def outcome_of(result, limit: int) -> ToolOutcome:
    """A ToolOutcome from the SDK's `CallToolResult`: its text parts joined, cut to `limit` characters."""
    import json

    parts = []
    for block in result.content or ():
        kind = getattr(block, "type", None)
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource" and hasattr(getattr(block, "resource", None), "text"):
            parts.append(block.resource.text)
        else:
            parts.append(f"[{kind} content left out: only text reaches the model]")
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return cut_outcome("\n".join(parts), bool(result.is_error), limit)


def cut_outcome(text: str, is_error: bool, limit: int) -> ToolOutcome:
    if len(text) <= limit:
        return ToolOutcome(text=text, is_error=is_error, cut=False)
    note = f"\n[output cut: the first {limit} of {len(text)} characters are shown]"
    return ToolOutcome(text=text[:limit] + note, is_error=is_error, cut=True)
