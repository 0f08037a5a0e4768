"""The body of `/v1/responses` (OpenAI's Responses API), and its translation into the engine's values.

`input` is a string or a list of items: messages (parts `input_text`, `output_text`,
`refusal`), `function_call` and `function_call_output` items, and `reasoning` items
(echoed by clients, skipped: Serge's models write none). Items are first written in
the one shape Serge stores and lists them in (`canonical`: ids, `status`, parts as
OpenAI lists them), and a conversation is made from such items (`conversation`), so
a stored chain and a new request become messages the same way.

Tools are OpenAI's flat function tools; hosted tools (`HOSTED`, and any other type
that is not `function`) are left out of what the model is offered, never refused.
Unknown top-level fields are a 400 naming them; an item's own unknown keys (clients
echo output items with fields of their own) are ignored and listed at debug level.
This module formats no replies.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import replace
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, ValidationError,
                      field_validator)

from serge.chats import MAX_MESSAGE_CHARS
from serge.engine import (MAX_TOP_LOGPROBS, RESPONSES_NAMES, Message, ResponseFormat, SamplingParams, Tool, ToolCall,
                          Tools)
from serge.web.errors import ApiError, describe_validation
from serge.web.file_parts import file_text, refuse_address
from serge.web.dialects import EchoedItem, StrictRequest, refused_settings
from serge.web.openai_models import MAX_TOOLS, NO_EFFECT

log = logging.getLogger(__name__)

MAX_INPUT_ITEMS = 1000
MAX_PARTS = 100
# Tools OpenAI runs on its own servers (or that need a client protocol Serge's models do not speak):
# left out of what the model is offered, named in the request log. Any other non-function type is too.
HOSTED = ("web_search", "web_search_preview", "file_search", "code_interpreter", "computer_use_preview",
          "computer", "image_generation", "local_shell", "shell", "mcp", "custom", "apply_patch", "tool_search")
# Accepted and without effect here (the API reference says so field by field).
HARMLESS = ("reasoning", "include (but message.output_text.logprobs)", "prompt_cache_key", "prompt_cache_retention",
            "client_metadata", "safety_identifier", "metadata", "user", "service_tier", "stream_options",
            "text.verbosity", "background: false")
LOGPROBS = "message.output_text.logprobs"


def _bad(message: str, param: str) -> ApiError:
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


class MediaPart(_Item):
    """Images and audio: refused, as Serge's models read text only."""

    type: Literal["input_image", "input_audio"]


class FilePart(_Item):
    """A text file (plain text, Markdown, code, HTML, PDF, DOCX): its text goes into the message, named."""

    type: Literal["input_file"]
    file_data: str | None = Field(None, description="The file's bytes: base64, or a data: URL of them.")
    filename: str | None = Field(None, max_length=255)
    file_id: str | None = Field(None, max_length=256, description="Refused: Serge has no Files API.")
    file_url: str | None = Field(None, max_length=2048, description="Refused: Serge fetches nothing a request names.")


Part = Annotated[TextPart | RefusalPart | MediaPart | FilePart, Field(discriminator="type")]


def _or_a_string(schema: dict) -> None:
    """The documented schema of a list that may also be sent as a plain string."""
    listed = dict(schema)
    schema.clear()
    schema["anyOf"] = [{"type": "string"}, listed]


def _text_is_a_part(value):
    return [{"type": "input_text", "text": value}] if isinstance(value, str) else value


# Text, or a list of parts (checked for size once joined).
Parts = Annotated[list[Part], BeforeValidator(_text_is_a_part), Field(max_length=MAX_PARTS,
                                                                      json_schema_extra=_or_a_string)]


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


class ReasoningItem(_Item):
    """A reasoning item a client echoes back: skipped (Serge's models write none)."""

    type: Literal["reasoning"]
    summary: list[Any] | None = None
    content: list[Any] | None = None
    encrypted_content: str | None = None


def _item_kind(data: Any) -> str:
    kind = data.get("type") if isinstance(data, dict) else getattr(data, "type", None)
    return kind or "message"  # a message may leave its type out (OpenAI's "easy" input message)


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")] | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_kind, custom_error_type="invalid_item", custom_error_message=(
        "an input item is a message, function_call, function_call_output or reasoning item; Serge takes no "
        "other type"))]


class FunctionTool(StrictRequest):
    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = Field(None, max_length=10_000)
    parameters: dict | None = Field(None, description="The arguments' JSON schema; a call is constrained to it.")
    strict: bool | None = Field(None, description="Enforced either way; strict also refuses schema keywords that "
                                                  "cannot be enforced.")
    defer_loading: bool | None = Field(None, description=NO_EFFECT)


class OtherTool(BaseModel):
    """A hosted tool (web_search, file_search, code_interpreter, mcp, ...): left out of what the model is offered."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(max_length=64)


def _tool_kind(data: Any) -> str:
    kind = data.get("type") if isinstance(data, dict) else getattr(data, "type", None)
    return "function" if kind == "function" else "other"


ToolIn = Annotated[Annotated[FunctionTool, Tag("function")] | Annotated[OtherTool, Tag("other")],
                   Discriminator(_tool_kind)]


class FunctionChoice(StrictRequest):
    type: Literal["function"]
    name: str


class AllowedTools(StrictRequest):
    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: list[dict] = Field(max_length=MAX_TOOLS, description="Function tools by name: {type: function, name}.")


class HostedChoice(BaseModel):
    """A tool_choice that forces a hosted tool: refused, as Serge runs none."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(max_length=64)


def _choice_kind(data: Any) -> str:
    if isinstance(data, str):
        return "mode"
    kind = data.get("type") if isinstance(data, dict) else getattr(data, "type", None)
    return kind if kind in ("function", "allowed_tools") else "hosted"


ToolChoiceIn = Annotated[
    Annotated[Literal["auto", "none", "required"], Tag("mode")] | Annotated[FunctionChoice, Tag("function")]
    | Annotated[AllowedTools, Tag("allowed_tools")] | Annotated[HostedChoice, Tag("hosted")],
    Discriminator(_choice_kind)]


class TextFormat(StrictRequest):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(None, description="json_schema: the schema's name.")
    schema_: dict | None = Field(None, alias="schema", description="json_schema: what the reply must match.")
    description: str | None = None
    strict: bool | None = Field(None, description="Enforced either way; strict also refuses keywords that cannot "
                                                  "be enforced.")

    model_config = ConfigDict(extra="forbid", populate_by_name=True, serialize_by_alias=True)

    def response_format(self) -> ResponseFormat | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return ResponseFormat(type="json_object")
        if self.name is None or self.schema_ is None:
            raise _bad("text.format of type json_schema needs name and schema", "text.format")
        try:
            return ResponseFormat.model_validate({"type": "json_schema", "json_schema": {
                "name": self.name, "schema": self.schema_, "description": self.description, "strict": self.strict}})
        except ValidationError as exc:
            message, _ = describe_validation(exc.errors())
            raise _bad(f"text.format: {message}", "text.format") from None


class TextConfig(StrictRequest):
    format: TextFormat | None = Field(None, description="text (the default), json_object or json_schema: enforced "
                                                        "by constrained decoding.")
    verbosity: Literal["low", "medium", "high"] | None = Field(None, description=NO_EFFECT)


class Reasoning(StrictRequest):
    effort: str | None = Field(None, max_length=16, description=NO_EFFECT)
    summary: str | None = Field(None, max_length=16, description=NO_EFFECT)
    generate_summary: str | None = Field(None, max_length=16, description=NO_EFFECT)


class StreamOptions(StrictRequest):
    include_obfuscation: bool | None = Field(None, description=NO_EFFECT)


class CreateResponse(StrictRequest):
    model: str | None = Field(None, description="An installed model; the server's default when left out.")
    input: list[InputItem] = Field(min_length=1, max_length=MAX_INPUT_ITEMS, json_schema_extra=_or_a_string,
                                   description="A user message as a string, or a list of items.")
    instructions: str | None = Field(None, max_length=MAX_MESSAGE_CHARS, description=(
        "A system message put first; not carried over from previous_response_id, as OpenAI's."))
    previous_response_id: str | None = Field(None, max_length=64, description=(
        "Continue a stored response: its chain's input and output come before this input."))
    store: bool = Field(True, description="Keep the response for retrieval and previous_response_id (the default).")
    stream: bool = False
    stream_options: StreamOptions | None = None
    tools: list[ToolIn] | None = Field(None, max_length=MAX_TOOLS, description=(
        f"Function tools. Hosted tools ({', '.join(HOSTED)}, and any other type but function) are left out of "
        f"what the model is offered and named in the request log."))
    tool_choice: ToolChoiceIn | None = Field(None, description="auto, none, required, {type: function, name} or "
                                                               "{type: allowed_tools, mode, tools}; a hosted tool "
                                                               "is a 400.")
    parallel_tool_calls: bool | None = Field(None, description="false: at most one call per reply.")
    text: TextConfig | None = None
    max_output_tokens: int | None = Field(None, description="Longest reply; status incomplete when reached.")
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS, description=(
        "Log-probabilities of each output token with this many alternatives (also: include "
        "message.output_text.logprobs)."))
    truncation: Literal["auto", "disabled"] | None = Field(None, description=(
        "disabled (the default): a conversation that does not fit is a 400 with the counts; auto: its oldest "
        "turns are left out."))
    include: list[str] | None = Field(None, max_length=32, description=(
        f"{LOGPROBS} adds log-probabilities; the others are accepted without effect."))
    reasoning: Reasoning | None = Field(None, description=NO_EFFECT)
    background: Literal[False] | None = Field(None, description="Only false: Serge answers in the foreground.")
    metadata: dict[str, str] | None = Field(None, max_length=16, description="Kept and echoed; no effect.")
    user: str | None = Field(None, max_length=256, description=NO_EFFECT)
    prompt_cache_key: str | None = Field(None, max_length=256,
                                         description=NO_EFFECT + " (Serge reuses shared prefixes anyway.)")
    prompt_cache_retention: str | None = Field(None, max_length=32, description=NO_EFFECT)
    safety_identifier: str | None = Field(None, max_length=256, description=NO_EFFECT)
    client_metadata: dict[str, Any] | None = Field(None, max_length=64, description=NO_EFFECT)
    service_tier: str | None = Field(None, max_length=32, description=NO_EFFECT)

    @field_validator("input", mode="before")
    @classmethod
    def _a_string_is_a_user_message(cls, value):
        return [{"type": "message", "role": "user", "content": value}] if isinstance(value, str) else value

    # --- into the engine's values ---------------------------------------------------------------
    @property
    def wants_logprobs(self) -> bool:
        return self.top_logprobs is not None or LOGPROBS in (self.include or ())

    def sampling(self) -> SamplingParams:
        fields = {ours: getattr(self, theirs) for ours, theirs in RESPONSES_NAMES.items()}
        fields["logprobs"] = (self.top_logprobs or 0) if self.wants_logprobs else None
        try:
            return SamplingParams(**fields)
        except ValidationError as exc:
            raise refused_settings(exc, {"max_new_tokens": "max_output_tokens"}) from None

    def response_format(self) -> ResponseFormat | None:
        return self.text.format.response_format() if self.text and self.text.format else None

    def functions(self) -> list[FunctionTool]:
        return [t for t in self.tools or () if isinstance(t, FunctionTool)]

    def left_out(self) -> list[str]:
        """The hosted tools asked for, which the model is not offered."""
        return [t.type for t in self.tools or () if isinstance(t, OtherTool)]

    def tool_offer(self) -> Tools | None:
        """The function tools and tool_choice as the engine takes them; None when none are offered."""
        choice, functions = self.tool_choice, self.functions()
        if isinstance(choice, HostedChoice):
            raise _bad(f"tool_choice asks for the hosted tool {choice.type!r}, which Serge cannot run; "
                       f"choose auto, none, required or a function", "tool_choice")
        names = [t.name for t in functions]
        if len(set(names)) != len(names):
            raise _bad("two tools have the same name", "tools")
        if not functions:
            if choice is not None and choice not in ("auto", "none"):
                raise _bad("tool_choice asks for a tool call, but no function tools were given", "tool_choice")
            return None
        parallel = self.parallel_tool_calls is not False
        if isinstance(choice, AllowedTools):
            allowed = {t.get("name") for t in choice.tools if t.get("type") == "function"}
            if unknown := allowed - set(names):
                raise _bad(f"tool_choice.tools names {sorted(unknown)}, which are not among the tools",
                           "tool_choice.tools")
            functions = [t for t in functions if t.name in allowed]
            choice = choice.mode if functions else "none"
        offered = tuple(Tool(t.name, t.description or "",
                             json.dumps(t.parameters or {"type": "object", "properties": {}}), bool(t.strict))
                        for t in functions)
        if isinstance(choice, FunctionChoice):
            return Tools(offered, "required", choice.name, parallel)
        return Tools(offered, choice or "auto", None, parallel)

    def input_items(self) -> list[dict]:
        """This request's input, as Serge stores and lists it."""
        return [canonical(item, i) for i, item in enumerate(self.input) if not isinstance(item, ReasoningItem)]


def _part_text(parts: list, param: str) -> str:
    texts = []
    for j, p in enumerate(parts):
        if isinstance(p, MediaPart):
            raise _bad(f"{param}.{j} is {p.type}; Serge's models read text only", f"{param}.{j}.type")
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
    if isinstance(item, MessageItem):
        text = _part_text(item.content, f"{param}.content")
        if len(text) > MAX_MESSAGE_CHARS:
            raise _bad(f"{param}.content is {len(text)} characters; the limit is {MAX_MESSAGE_CHARS}",
                       f"{param}.content")
        if item.role == "assistant":
            return {"type": "message", "id": item.id or new_id("msg"), "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}
        return {"type": "message", "id": item.id or new_id("msg"), "role": item.role, "status": "completed",
                "content": [{"type": "input_text", "text": text}]}
    if isinstance(item, FunctionCallItem):
        return {"type": "function_call", "id": item.id or new_id("fc"), "call_id": item.call_id, "name": item.name,
                "arguments": item.arguments, "status": "completed"}
    output = _part_text(item.output, f"{param}.output")
    if len(output) > MAX_MESSAGE_CHARS:
        raise _bad(f"{param}.output is {len(output)} characters; the limit is {MAX_MESSAGE_CHARS}", f"{param}.output")
    return {"type": "function_call_output", "id": item.id or new_id("fco"), "call_id": item.call_id,
            "output": output, "status": "completed"}


def conversation(instructions: str | None, items: list[dict]) -> list[Message]:
    """The engine's messages for stored-shape items: a function_call joins the assistant message before it."""
    messages = [Message("system", instructions)] if instructions else []
    for item in items:
        kind = item["type"]
        if kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            messages.append(Message(role, "".join(p.get("text", "") for p in item["content"])))
        elif kind == "function_call":
            call = ToolCall(item["call_id"], item["name"], item["arguments"])
            if messages and messages[-1].role == "assistant":
                messages[-1] = replace(messages[-1], tool_calls=(*messages[-1].tool_calls, call))
            else:
                messages.append(Message("assistant", "", (call,)))
        elif kind == "function_call_output":
            messages.append(Message("tool", item["output"], tool_call_id=item["call_id"]))
    return messages
