"""The input items of `/v1/responses` (OpenAI's Responses API), and how they become the engine's messages.

An item is a message (parts `input_text`, `output_text`, `refusal`), a `function_call`,
a `function_call_output`, an MCP item (`mcp_approval_response`, and `mcp_list_tools`,
`mcp_call`, `mcp_approval_request` sent back: a call becomes the assistant's call and its
result), or a `reasoning` item (a model's earlier thoughts, which clients such as the Agents
SDK and Codex send back: accepted, and left out of the prompt, as thinking templates leave
earlier thoughts out). Items are first written in
the one shape Serge stores and lists them in (`canonical`: ids, `status`, parts as
OpenAI lists them), and a conversation is made from such items (`conversation`), so
a stored chain and a new request become messages the same way. An item's own unknown
keys (clients echo output items with fields of their own) are ignored and listed at
debug level. The request around the items is `responses.models`'.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Discriminator, Field, Tag

from serge.chats import MAX_MESSAGE_CHARS
from serge.engine import Message, ToolCall
from serge.web.http.dialects import EchoedItem
from serge.web.http.errors import ApiError
from serge.web.http.file_parts import file_text, image, refuse_address
from serge.web.openai.chat_models import NO_EFFECT

MAX_PARTS = 100


def invalid(message: str, param: str) -> ApiError:
    return ApiError(400, message, code="invalid_value", param=param)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class _Item(EchoedItem):
    """An input item (clients echo output items with fields of their own)."""

    id: str | None = Field(None, max_length=256, description="The item's id, as Serge returned it.")
    status: Literal["in_progress", "completed", "incomplete"] | None = Field(None, description=NO_EFFECT)


class TextPart(_Item):
    type: Literal["input_text", "output_text"]
    text: str


class RefusalPart(_Item):
    type: Literal["refusal"]
    refusal: str


class ImagePart(_Item):
    """An image for a vision model, as a data: URL; a remote URL or a file id is refused."""

    type: Literal["input_image"]
    image_url: str | None = Field(None, description="A data: URL of the image's bytes (base64).")
    file_id: str | None = Field(None, max_length=256, description="Refused: Serge has no Files API.")
    detail: Literal["low", "high", "auto"] | None = Field(None, description=NO_EFFECT)


class AudioPart(_Item):
    """Audio: refused, as Serge's models do not hear."""

    type: Literal["input_audio"]


class FilePart(_Item):
    """A text file (plain text, Markdown, code, HTML, PDF, DOCX): its text goes into the message, named."""

    type: Literal["input_file"]
    file_data: str | None = Field(None, description="The file's bytes: base64, or a data: URL of them.")
    filename: str | None = Field(None, max_length=255)
    file_id: str | None = Field(None, max_length=256, description="Refused: Serge has no Files API.")
    file_url: str | None = Field(None, max_length=2048, description="Refused: Serge fetches nothing a request names.")


Part = Annotated[TextPart | RefusalPart | ImagePart | AudioPart | FilePart, Field(discriminator="type")]


def or_a_string(schema: dict) -> None:
    """The documented schema of a list that may also be sent as a plain string."""
    listed = dict(schema)
    schema.clear()
    schema["anyOf"] = [{"type": "string"}, listed]


def _text_is_a_part(value):
    return [{"type": "input_text", "text": value}] if isinstance(value, str) else value


# Text, or a list of parts (checked for size once joined).
Parts = Annotated[list[Part], BeforeValidator(_text_is_a_part), Field(max_length=MAX_PARTS,
                                                                      json_schema_extra=or_a_string)]


class MessageItem(_Item):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"] = Field(
        description="developer is treated as system; system and developer messages may come anywhere.")
    content: Parts = Field(description="The text, or a list of parts.")


class FunctionCallItem(_Item):
    type: Literal["function_call"]
    call_id: str = Field(max_length=256)
    name: str = Field(max_length=64)
    arguments: str = Field(description="The call's arguments, as JSON text.")


class FunctionCallOutputItem(_Item):
    type: Literal["function_call_output"]
    call_id: str = Field(max_length=256, description="The call this answers.")
    output: Parts = Field(description="What the function returned, as text (or text parts).")


class ToolAnnotations(EchoedItem):
    read_only: bool | None = None


class ListedTool(EchoedItem):
    """One tool of an mcp_list_tools item sent back, checked as Serge wrote it: it is offered to the model again."""

    name: str = Field(min_length=1, max_length=128)
    description: str | None = Field(None, max_length=MAX_MESSAGE_CHARS)
    input_schema: dict | None = None
    annotations: ToolAnnotations | None = None


class McpListToolsItem(_Item):
    """An mcp_list_tools item sent back: the tools a server was listed with, so it is not listed again."""

    type: Literal["mcp_list_tools"]
    server_label: str = Field(max_length=64)
    tools: list[ListedTool] = Field(max_length=1000)
    error: str | None = Field(None, max_length=10_000)


class _McpCall(_Item):
    """A call of one server's tool, as the model wrote it: what an approval request and a call item share."""

    server_label: str = Field(max_length=64)
    name: str = Field(max_length=128)
    arguments: str = Field(max_length=MAX_MESSAGE_CHARS)


class McpApprovalRequestItem(_McpCall):
    """An mcp_approval_request item sent back: a call the model asked to make."""

    type: Literal["mcp_approval_request"]


class McpApprovalResponseItem(_Item):
    """The answer to an mcp_approval_request: approve runs the call, else the model is told it was denied."""

    type: Literal["mcp_approval_response"]
    approval_request_id: str = Field(max_length=256)
    approve: bool
    reason: str | None = Field(None, max_length=10_000)


class McpCallItem(_McpCall):
    """An mcp_call item sent back: a call Serge ran, with its output or error."""

    type: Literal["mcp_call"]
    output: str | None = Field(None, max_length=MAX_MESSAGE_CHARS)
    error: Any = None
    approval_request_id: str | None = Field(None, max_length=256)
    status: str | None = Field(None, max_length=32)


MCP_ITEMS = (McpListToolsItem, McpApprovalRequestItem, McpApprovalResponseItem, McpCallItem)


class ReasoningItem(_Item):
    """A reasoning item a client sends back (a model's earlier thoughts): accepted, left out of the prompt."""

    type: Literal["reasoning"]
    summary: list[Any] | None = None
    content: list[Any] | None = None
    encrypted_content: str | None = None


def _item_kind(data: Any) -> str:
    kind = data.get("type") if isinstance(data, dict) else getattr(data, "type", None)
    return kind or "message"  # a message may leave its type out (OpenAI's "easy" input message)


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")] | Annotated[ReasoningItem, Tag("reasoning")]
    | Annotated[McpListToolsItem, Tag("mcp_list_tools")]
    | Annotated[McpApprovalRequestItem, Tag("mcp_approval_request")]
    | Annotated[McpApprovalResponseItem, Tag("mcp_approval_response")] | Annotated[McpCallItem, Tag("mcp_call")],
    Discriminator(_item_kind, custom_error_type="invalid_item", custom_error_message=(
        "an input item is a message, function_call, function_call_output, reasoning, mcp_list_tools, "
        "mcp_approval_request, mcp_approval_response or mcp_call item; Serge takes no other type"))]


def _part_text(parts: list, param: str, images: bool = False) -> str:
    """The parts' text; `images`: image parts may be among them (a user's), checked and left to `_images`."""
    texts = []
    for j, p in enumerate(parts):
        if isinstance(p, ImagePart) and images:
            if p.file_id is not None or not p.image_url:
                raise refuse_address(f"{param}.{j}")
            image(p.image_url, f"{param}.{j}.image_url")
            continue
        if isinstance(p, (ImagePart, AudioPart)):
            where = "in a user message" if isinstance(p, ImagePart) else "nowhere: Serge's models do not hear"
            raise invalid(f"{param}.{j} is {p.type}, which Serge takes {where}", f"{param}.{j}.type")
        if isinstance(p, FilePart):
            if p.file_id is not None or p.file_url is not None or not p.file_data:
                raise refuse_address(f"{param}.{j}")
            texts.append(file_text(p.file_data, f"{param}.{j}.file_data", p.filename) + "\n\n")
        else:
            texts.append(p.text if isinstance(p, TextPart) else p.refusal)
    return "".join(texts)


def canonical(item: MessageItem | FunctionCallItem | FunctionCallOutputItem, index: int) -> dict:
    """An input item as the API lists it (and Serge stores it), with an id; checked for size and media."""
    param = f"input.{index}"
    if isinstance(item, MCP_ITEMS):
        prefix = {"mcp_list_tools": "mcpl", "mcp_approval_request": "mcpr", "mcp_approval_response": "mcpa",
                  "mcp_call": "mcp"}[item.type]
        return {**item.model_dump(exclude_none=True, exclude={"status"} if item.type != "mcp_call" else set()),
                "id": item.id or new_id(prefix)}
    if isinstance(item, MessageItem):
        text = _part_text(item.content, f"{param}.content", images=item.role == "user")
        if len(text) > MAX_MESSAGE_CHARS:
            raise invalid(f"{param}.content is {len(text)} characters; the limit is {MAX_MESSAGE_CHARS}",
                       f"{param}.content")
        if item.role == "assistant":
            return {"type": "message", "id": item.id or new_id("msg"), "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}
        pictures = [{"type": "input_image", "image_url": p.image_url} for p in item.content if isinstance(p, ImagePart)]
        return {"type": "message", "id": item.id or new_id("msg"), "role": item.role, "status": "completed",
                "content": [{"type": "input_text", "text": text}, *pictures]}
    if isinstance(item, FunctionCallItem):
        return {"type": "function_call", "id": item.id or new_id("fc"), "call_id": item.call_id, "name": item.name,
                "arguments": item.arguments, "status": "completed"}
    output = _part_text(item.output, f"{param}.output")
    if len(output) > MAX_MESSAGE_CHARS:
        raise invalid(f"{param}.output is {len(output)} characters; the limit is {MAX_MESSAGE_CHARS}",
                      f"{param}.output")
    return {"type": "function_call_output", "id": item.id or new_id("fco"), "call_id": item.call_id,
            "output": output, "status": "completed"}


def conversation(instructions: str | None, items: list[dict]) -> list[Message]:
    """The engine's messages for stored-shape items: a function_call joins the assistant message before it."""
    messages = [Message("system", instructions)] if instructions else []
    for item in items:
        kind = item["type"]
        if kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            pictures = tuple(image(p["image_url"], "input") for p in item["content"] if p["type"] == "input_image")
            messages.append(Message(role, "".join(p.get("text", "") for p in item["content"]), images=pictures))
        elif kind == "function_call":
            call = ToolCall(item["call_id"], item["name"], item["arguments"])
            if messages and messages[-1].role == "assistant":
                messages[-1] = replace(messages[-1], tool_calls=(*messages[-1].tool_calls, call))
            else:
                messages.append(Message("assistant", "", (call,)))
        elif kind == "function_call_output":
            messages.append(Message("tool", item["output"], tool_call_id=item["call_id"]))
        elif kind in ("mcp_approval_request", "mcp_call"):
            _mcp_call(messages, item)
        elif kind == "mcp_approval_response" and not item["approve"]:
            messages.append(Message("tool", DENIED, tool_call_id=item["approval_request_id"]))
    return messages


DENIED = "The user denied this call; it was not run."


def _mcp_call(messages: list[Message], item: dict) -> None:
    """A call of an MCP tool: the assistant's call (unless an approval request made it already), and its result."""
    call_id = item.get("approval_request_id") or item["id"]
    if item["type"] == "mcp_approval_request" or not item.get("approval_request_id"):
        call = ToolCall(call_id, item["name"], item["arguments"])
        if messages and messages[-1].role == "assistant":
            messages[-1] = replace(messages[-1], tool_calls=(*messages[-1].tool_calls, call))
        else:
            messages.append(Message("assistant", "", (call,)))
    if item["type"] == "mcp_call":
        error = item.get("error")
        text = item.get("output") if not error else f"the call failed: {_error_text(error)}"
        messages.append(Message("tool", text or "", tool_call_id=call_id))


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        if isinstance(error.get("content"), list):
            return "".join(p.get("text", "") for p in error["content"] if isinstance(p, dict))
        return str(error.get("message", error))
    return str(error)
