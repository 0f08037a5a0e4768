"""The bodies of `/v1/messages` (Anthropic's Messages API) as Serge understands them, and their
translation into the engine's own values (`Message`, `SamplingParams`, `Tools`, `ResponseFormat`).

Every field declared here is implemented, or accepted without effect where it asks nothing of a
local model (`NO_EFFECT_FIELDS`, listed in the route's docs); anything else, at any level, is a 400
naming it (the models forbid unknown fields; only a message's own unknown keys are ignored, as clients
echo messages with keys of their own, and logged at debug level). A field sent as null is one not
sent. A user's image blocks (base64) become the message's images.
This module formats no replies (`anthropic.api` does, with their shapes).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, model_validator

from serge.chats import MAX_MESSAGE_CHARS
from serge.engine import ANTHROPIC_NAMES, MAX_STOP_STRINGS, Image, Message, ResponseFormat, SamplingParams, Tool, ToolCall, Tools
from serge.documents import marked
from serge.web.http.errors import ApiError
from serge.web.http.file_parts import file_text, image, named, refuse_address
from serge.web.http.dialects import EchoedItem, StrictRequest, TOOL_TEXT, refused_settings


MAX_MESSAGES_PER_REQUEST = 500
MAX_BLOCKS = 500  # content blocks in one message, or in the system prompt
MAX_TOOLS = 128
NO_EFFECT = "Accepted for compatibility with Anthropic's API; it has no effect in Serge."
# Fields clients send that change nothing a local model does: accepted, without effect (declared below).
NO_EFFECT_FIELDS = ("cache_control (on the request, blocks and tools)", "thinking (budget_tokens: a model that thinks thinks as its template says; type disabled asks it not to)",
                    "context_management", "output_config.effort", "service_tier", "inference_geo", "speed",
                    "metadata", "citations on text blocks", "eager_input_streaming", "thinking and "
                    "redacted_thinking blocks in earlier turns (left out of the prompt)",
                    "the anthropic-version and anthropic-beta headers", "the ?beta=true query")


def _bad(message: str, param: str) -> ApiError:
    return ApiError(400, message, code="invalid_value", param=param)


class _Strict(StrictRequest):
    """Unknown fields are a 400 naming them; null is a field not sent."""


class CacheControl(_Strict):
    type: Literal["ephemeral"]
    ttl: str | None = Field(None, max_length=16)


class TextBlock(_Strict):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = Field(None, description=NO_EFFECT)
    citations: list[Any] | None = Field(None, max_length=0, description="Only empty or null.")


class ImageBlock(_Strict):
    """An image for a vision model, as base64; a url or file source is refused: Serge fetches nothing."""

    type: Literal["image"]
    source: dict[str, Any] = Field(description="base64 (media_type, data); url and file are refused.")
    cache_control: CacheControl | None = Field(None, description=NO_EFFECT)

    def image(self, where: str) -> Image:
        kind, data = self.source.get("type"), self.source.get("data")
        if kind in ("url", "file"):
            raise refuse_address(f"{where}.source")
        if kind != "base64" or not isinstance(data, str):
            raise _bad(f"{where}.source: send a base64 source", f"{where}.source.type")
        return image(data, f"{where}.source.data")


class DocumentBlock(_Strict):
    """A text file (PDF, plain text, Markdown, HTML, DOCX) as base64 or text: its text goes into the message,
    named by its title. A url or file source is refused: Serge fetches nothing a request names."""

    type: Literal["document"]
    source: dict[str, Any] = Field(description="base64 (media_type, data) or text (data); url and file are refused.")
    title: str | None = Field(None, max_length=255)
    context: str | None = Field(None, max_length=10_000, description=NO_EFFECT)
    citations: dict[str, Any] | None = Field(None, description=NO_EFFECT)
    cache_control: CacheControl | None = Field(None, description=NO_EFFECT)

    def text(self, where: str) -> str:
        kind, media = self.source.get("type"), self.source.get("media_type")
        data = self.source.get("data")
        if kind in ("base64", "text") and isinstance(data, str):
            if kind == "text":
                return marked(named(self.title, media or "text/plain"), (data,))
            return file_text(data, f"{where}.source.data", self.title, media)
        if kind in ("url", "file"):
            raise refuse_address(f"{where}.source")
        raise _bad(f"{where}.source: send a base64 or text source", f"{where}.source.type")


class ToolUseBlock(_Strict):
    type: Literal["tool_use"]
    id: str = Field(max_length=256)
    name: str = Field(max_length=128)
    input: dict[str, Any]
    cache_control: CacheControl | None = Field(None, description=NO_EFFECT)


class ToolResultBlock(_Strict):
    type: Literal["tool_result"]
    tool_use_id: str = Field(max_length=256)
    content: str | Annotated[list[Annotated[TextBlock | ImageBlock, Field(discriminator="type")]],
                             Field(max_length=MAX_BLOCKS)] = ""
    is_error: bool | None = Field(None, description="true: the result is written as an error for the model.")
    cache_control: CacheControl | None = Field(None, description=NO_EFFECT)


class ThinkingBlock(_Strict):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Strict):
    type: Literal["redacted_thinking"]
    data: str


Block = Annotated[TextBlock | ImageBlock | DocumentBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock
                  | RedactedThinkingBlock,
                  Field(discriminator="type")]


class MessageIn(EchoedItem):
    role: Literal["user", "assistant", "system"] = Field(
        description="system is not Anthropic's, but some clients send it: it counts as a system prompt there.")
    content: str | Annotated[list[Block], Field(max_length=MAX_BLOCKS)]


class ToolIn(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,128}$")
    description: str | None = Field(None, description=TOOL_TEXT)
    input_schema: dict[str, Any] = Field(description="The input's JSON schema; a tool_use is constrained to it.")
    type: Literal["custom"] | None = None
    strict: bool | None = Field(None, description="Enforced either way; strict also refuses schema keywords "
                                                  "that cannot be enforced.")
    cache_control: CacheControl | None = Field(None, description=NO_EFFECT)
    eager_input_streaming: bool | None = Field(None, description=NO_EFFECT + " (input is always streamed.)")

    @model_validator(mode="before")
    @classmethod
    def _client_tools_only(cls, value):
        kind = value.get("type") if isinstance(value, dict) else None
        if kind not in (None, "custom"):
            raise ValueError(f"{kind!r} is a server tool, which Serge does not run; offer client tools "
                             "(name, description, input_schema) only")
        return value


class ToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = Field(None, max_length=128, description="With type tool: the tool to use.")
    disable_parallel_tool_use: bool | None = Field(None, description="true: at most one tool_use.")

    @model_validator(mode="after")
    def _name_with_tool(self):
        if (self.type == "tool") != (self.name is not None):
            raise ValueError("name is required with type tool, and only then")
        return self


class JsonOutputFormat(_Strict):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema", description="The JSON schema the reply's text must match.")


class OutputConfig(_Strict):
    format: JsonOutputFormat | None = Field(None, description="Enforced by constrained decoding.")
    effort: str | None = Field(None, max_length=16, description=NO_EFFECT)


class Metadata(_Strict):
    user_id: str | None = Field(None, max_length=256)


class _Conversation(_Strict):
    """What a request to create a message and one to count its tokens share."""

    model: str = Field(max_length=256, description="An installed model (`GET /v1/models` lists them).")
    messages: list[MessageIn] = Field(min_length=1, max_length=MAX_MESSAGES_PER_REQUEST)
    system: str | Annotated[list[TextBlock], Field(max_length=MAX_BLOCKS)] | None = None
    tools: list[ToolIn] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    output_config: OutputConfig | None = None
    thinking: dict[str, Any] | None = Field(None, description=(
        "A model that thinks gives its thoughts as thinking blocks; {\"type\": \"disabled\"} asks its template not "
        "to think, where it can. budget_tokens has no effect."))
    context_management: dict[str, Any] | None = Field(None, description=NO_EFFECT)
    cache_control: CacheControl | None = Field(None, description=NO_EFFECT)

    def conversation(self) -> list[Message]:
        """The system prompt and messages as the engine's; consecutive user (or assistant) turns are one turn."""
        out: list[Message] = []
        if self.system:
            out.append(Message("system", _text(self.system, "system")))
        for i, m in enumerate(self.messages):
            where = f"messages.{i}.content"
            blocks = [TextBlock(type="text", text=m.content)] if isinstance(m.content, str) else m.content
            if m.role == "system":
                out.append(Message("system", _text(blocks, where)))
            elif m.role == "assistant":
                _merge(out, _assistant(blocks, where))
            else:
                for message in _user(blocks, where):
                    _merge(out, message)
        return out

    def tool_offer(self) -> Tools | None:
        choice = self.tool_choice
        if not self.tools:
            if choice is not None and choice.type in ("any", "tool"):
                raise _bad(f"tool_choice {choice.type} asks for a tool_use, but no tools were given", "tool_choice")
            return None
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise _bad("two tools have the same name", "tools")
        functions = tuple(Tool(t.name, t.description or "", json.dumps(t.input_schema), bool(t.strict))
                          for t in self.tools)
        parallel = not (choice and choice.disable_parallel_tool_use)
        if choice is None or choice.type == "auto":
            return Tools(functions, "auto", None, parallel)
        if choice.type == "none":
            return Tools(functions, "none")
        return Tools(functions, "required", choice.name, parallel)

    def response_format(self) -> ResponseFormat | None:
        found = self.output_config.format if self.output_config else None
        if found is None:
            return None
        return ResponseFormat(type="json_schema", json_schema={"name": "output", "schema": found.schema_})


class MessagesRequest(_Conversation):
    """Anthropic's create-message body."""

    max_tokens: int = Field(ge=1, description="Required. Above what the context window leaves for the reply, it "
                                              "is capped to that (stop_reason max_tokens if reached).")
    stream: bool | None = None
    stop_sequences: list[str] | None = Field(None, description=f"Up to {MAX_STOP_STRINGS} strings that end the "
                                                             "reply.")
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    metadata: Metadata | None = Field(None, description=NO_EFFECT)
    service_tier: str | None = Field(None, max_length=32, description=NO_EFFECT)
    inference_geo: str | None = Field(None, max_length=64, description=NO_EFFECT)
    speed: str | None = Field(None, max_length=16, description=NO_EFFECT)

    def sampling(self, max_tokens: int | None = None) -> SamplingParams:
        """The sampling settings; `max_tokens` in place of the request's (once capped to the window)."""
        fields = {ours: getattr(self, theirs) for ours, theirs in ANTHROPIC_NAMES.items()}
        if max_tokens is not None:
            fields["max_new_tokens"] = max_tokens
        try:
            return SamplingParams(**fields)
        except ValidationError as exc:
            raise refused_settings(exc, ANTHROPIC_NAMES) from None


class CountTokensRequest(_Conversation):
    """Anthropic's count-tokens body: a message's, less what only generation needs."""


# --- blocks into messages ---------------------------------------------------------------------------------
def _text(blocks: str | list, where: str, images: bool = False) -> str:
    """The blocks' text; `images`: image blocks may be among them (a user's), and are left to `_images`."""
    if isinstance(blocks, str):
        text = blocks
    else:
        parts = []
        for j, b in enumerate(blocks):
            if isinstance(b, ImageBlock):
                if images:
                    continue
                raise _no_images(f"{where}.{j}")
            if isinstance(b, DocumentBlock):
                parts.append(b.text(f"{where}.{j}"))
                continue
            if not isinstance(b, TextBlock):
                raise _bad(f"{where}.{j}: a {b.type} block cannot be here, only text", f"{where}.{j}.type")
            parts.append(b.text)
        text = "\n\n".join(parts)
    if len(text) > MAX_MESSAGE_CHARS:
        raise _bad(f"{where} is {len(text)} characters; the limit is {MAX_MESSAGE_CHARS}", where)
    return text


def _no_images(where: str) -> ApiError:
    return _bad(f"{where}: an image can only be in a user message's content", where)


def _images(blocks: list, where: str) -> tuple[Image, ...]:
    return tuple(b.image(f"{where}.{j}") for j, b in enumerate(blocks) if isinstance(b, ImageBlock))


def _assistant(blocks: list, where: str) -> Message:
    texts, calls = [], []
    for j, b in enumerate(blocks):
        if isinstance(b, TextBlock):
            texts.append(b)
        elif isinstance(b, ToolUseBlock):
            calls.append(ToolCall(b.id, b.name, json.dumps(b.input)))
        elif isinstance(b, ImageBlock):
            raise _no_images(f"{where}.{j}")
        elif isinstance(b, (ToolResultBlock, DocumentBlock)):
            raise _bad(f"{where}.{j}: a {b.type} belongs in a user message", f"{where}.{j}.type")
        # thinking and redacted_thinking: earlier reasoning, left out of the prompt
    return Message("assistant", _text(texts, where), tuple(calls))


def _user(blocks: list, where: str) -> list[Message]:
    """A user turn: each tool_result becomes a tool message, the text around them user messages."""
    out, texts = [], []
    for j, b in enumerate(blocks):
        if isinstance(b, ToolResultBlock):
            if texts:
                out.append(Message("user", _text(texts, where, True), images=_images(texts, where)))
                texts = []
            result = _text(b.content, f"{where}.{j}.content")
            out.append(Message("tool", f"Error: {result}" if b.is_error else result, tool_call_id=b.tool_use_id))
        elif isinstance(b, (TextBlock, ImageBlock, DocumentBlock)):
            texts.append(b)
        else:
            raise _bad(f"{where}.{j}: a {b.type} block belongs in an assistant message", f"{where}.{j}.type")
    if texts or not out:
        out.append(Message("user", _text(texts, where, True), images=_images(texts, where)))
    return out


def _merge(out: list[Message], message: Message) -> None:
    """Anthropic's rule: consecutive user turns, or assistant turns, are one turn."""
    last = out[-1] if out else None
    if last is not None and last.role == message.role and message.role in ("user", "assistant"):
        text = "\n\n".join(t for t in (last.content, message.content) if t)
        out[-1] = Message(last.role, text, last.tool_calls + message.tool_calls, images=last.images + message.images)
    else:
        out.append(message)
