"""The body of `/v1/chat/completions`, as Serge understands it: every field, and nothing silently dropped.

A field Serge does not implement is refused with a 400 naming it (the models here
forbid unknown fields, at every level). The few OpenAI fields that change nothing a
local model does (`HARMLESS`) are accepted and documented as having no effect.
This module turns a request into the engine's own values (`Message`,
`SamplingParams`, `Tools`); it formats no replies.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError

from serge.chats import MAX_MESSAGE_CHARS
from serge.engine import MAX_TOP_LOGPROBS, OPENAI_NAMES, Image, Message, ResponseFormat, SamplingParams, Tool, ToolCall, Tools
from serge.web.http.dialects import EchoedItem, StrictRequest, TOOL_TEXT, refused_settings
from serge.web.http.errors import ApiError
from serge.web.http.file_parts import file_text, image, refuse_address


MAX_MESSAGES_PER_REQUEST = 500
MAX_TOOLS = 128
MAX_CHOICES = 8  # n: replies to one request, sharing its prefill
OPENAI_MAX_STOP = 4  # stop strings: OpenAI's documented limit, kept where its chat completions promise it
NO_EFFECT = "Accepted for compatibility with OpenAI's API; it has no effect in Serge."
# OpenAI's fields that ask nothing of a local model: accepted, without effect (declared below).
HARMLESS = ("user", "metadata", "store", "service_tier", "prompt_cache_key", "prompt_cache_retention",
            "safety_identifier")
# Some of OpenAI's fields Serge does not implement; they, and any field not declared below, are a 400.
REFUSED = ("audio", "modalities other than text", "prediction", "verbosity",
           "web_search_options", "functions", "function_call", f"n > {MAX_CHOICES}")


def _bad(message: str, param: str) -> ApiError:
    return ApiError(400, message, code="invalid_value", param=param)


class TextPart(StrictRequest):
    type: Literal["text"]
    text: str


class FileIn(StrictRequest):
    file_data: str | None = Field(None, description="The file's bytes: base64, or a data: URL of them.")
    filename: str | None = Field(None, max_length=255, description="Its name, which says its format.")
    file_id: str | None = Field(None, max_length=256, description="Refused: Serge has no Files API; send file_data.")


class FilePart(StrictRequest):
    """A text file (plain text, Markdown, code, HTML, PDF, DOCX): its text goes into the message, named."""

    type: Literal["file"]
    file: FileIn

    def text(self, where: str) -> str:
        if self.file.file_id is not None or not self.file.file_data:
            raise refuse_address(f"{where}.file")
        return file_text(self.file.file_data, f"{where}.file.file_data", self.file.filename)


class ImageUrl(StrictRequest):
    url: str = Field(description="A data: URL of the image's bytes (base64); a remote URL is refused.")
    detail: Literal["low", "high", "auto"] | None = Field(None, description=NO_EFFECT)


class ImageUrlPart(StrictRequest):
    """An image for a vision model (a user message's); Serge fetches nothing, so only a data: URL."""

    type: Literal["image_url"]
    image_url: ImageUrl

    def image(self, where: str) -> Image:
        return image(self.image_url.url, f"{where}.image_url.url")


class FunctionCallIn(StrictRequest):
    name: str = Field(max_length=64)
    arguments: str = Field(description="The call's arguments, as JSON text.")


class ToolCallIn(StrictRequest):
    id: str = Field(max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessageIn(EchoedItem):
    role: Literal["system", "developer", "user", "assistant", "tool"] = Field(
        description="developer is treated as system; tool answers an assistant's tool call.")
    content: str | list[Annotated[TextPart | FilePart | ImageUrlPart, Field(discriminator="type")]] | None = Field(
        None, description="The text, or a list of text, file and (a user's) image_url parts; may be null for an "
                          "assistant's tool calls.")
    name: str | None = Field(None, max_length=256, description="A participant's name; the template decides its use.")
    tool_calls: list[ToolCallIn] | None = Field(None, description="An assistant's calls, as Serge returned them.")
    tool_call_id: str | None = Field(None, max_length=256, description="A tool message: the call it answers.")
    refusal: None = Field(None, description="Echoed assistant messages may carry it, as null.")
    annotations: list[Any] | None = Field(None, description=NO_EFFECT)

    def text(self, where: str = "content") -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text if isinstance(p, TextPart) else p.text(f"{where}.{j}") + "\n\n"
                       for j, p in enumerate(self.content) if not isinstance(p, ImageUrlPart))

    def images(self, where: str = "content") -> tuple[Image, ...]:
        if not isinstance(self.content, list):
            return ()
        found = tuple(p.image(f"{where}.{j}") for j, p in enumerate(self.content) if isinstance(p, ImageUrlPart))
        if found and self.role != "user":
            raise _bad(f"{where}: an image can only be in a user message", where)
        return found


class FunctionDefinition(StrictRequest):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = Field(None, description=TOOL_TEXT)
    parameters: dict | None = Field(None, description="The arguments' JSON schema; the call is constrained to it.")
    strict: bool | None = Field(None, description="Enforced either way; strict also refuses schema keywords "
                                                  "that cannot be enforced.")


class ToolIn(StrictRequest):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(StrictRequest):
    name: str


class NamedToolChoice(StrictRequest):
    type: Literal["function"]
    function: FunctionName


class StreamOptions(StrictRequest):
    include_usage: bool = False
    include_obfuscation: bool | None = Field(None, description=NO_EFFECT)


class ChatCompletionRequest(StrictRequest):
    model: str | None = Field(None, description="An installed model; the server's default when left out.")
    messages: list[ChatMessageIn] = Field(min_length=1, max_length=MAX_MESSAGES_PER_REQUEST)
    stream: bool = False
    stream_options: StreamOptions | None = Field(None, description="Only with stream: true.")
    n: int = Field(1, ge=1, le=MAX_CHOICES, description=f"Choices to return (1 to {MAX_CHOICES}); they share one "
                                                        "prefill of the prompt and decode in one batch.")
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stop: str | list[str] | None = Field(None, description=f"Up to {OPENAI_MAX_STOP} strings, as OpenAI allows.")
    seed: int | None = Field(None, description="Makes sampling repeatable; with n > 1, choice i uses seed + i.")
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[int, float] | None = Field(None, description="Token id -> -100 to 100, added to its score.")
    logprobs: bool | None = Field(None, description="Return each chosen token's log-probability.")
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS,
                                     description="With logprobs: this many likeliest alternatives per token.")
    response_format: ResponseFormat | None = Field(None, description="text, json_object or json_schema: "
                                                                     "enforced by constrained decoding.")
    tools: list[ToolIn] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = Field(None, description="false: at most one call per reply.")
    modalities: list[Literal["text"]] | None = Field(None, description="Only text.")
    top_k: int | None = Field(None, description="Not in OpenAI's API: keep the k most likely tokens.")
    min_p: float | None = Field(None, description="Not in OpenAI's API: minimum probability relative to the top token.")
    repetition_penalty: float | None = Field(None, description="Not in OpenAI's API: >1 discourages repeats.")
    ignore_eos: bool | None = Field(None, description="Not in OpenAI's API: generate past end-of-turn (benchmarks).")
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = Field(
        None, description="For a model that thinks: none or minimal asks its template not to (where the template "
                          "allows); any other value lets it think. Its thoughts come back as reasoning_content.")
    user: str | None = Field(None, description=NO_EFFECT)
    metadata: dict[str, str] | None = Field(None, description=NO_EFFECT)
    store: bool | None = Field(None, description=NO_EFFECT)
    service_tier: str | None = Field(None, description=NO_EFFECT)
    prompt_cache_key: str | None = Field(None, description=NO_EFFECT + " (Serge reuses shared prefixes anyway.)")
    prompt_cache_retention: str | None = Field(None, description=NO_EFFECT)
    safety_identifier: str | None = Field(None, description=NO_EFFECT)

    def sampling(self) -> SamplingParams:
        if self.top_logprobs is not None and not self.logprobs:
            raise _bad("top_logprobs needs logprobs: true", "top_logprobs")
        if isinstance(self.stop, list) and len(self.stop) > OPENAI_MAX_STOP:
            raise _bad(f"stop has {len(self.stop)} strings; OpenAI's chat completions take at most {OPENAI_MAX_STOP}",
                       "stop")
        fields = {ours: getattr(self, theirs) for ours, theirs in OPENAI_NAMES.items() if ours not in ("logprobs",)}
        fields["max_new_tokens"] = self.max_completion_tokens if self.max_completion_tokens is not None \
            else self.max_tokens
        fields["logprobs"] = (self.top_logprobs or 0) if self.logprobs else None
        try:
            return SamplingParams(**fields)
        except ValidationError as exc:
            limit = "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"
            raise refused_settings(exc, {"max_new_tokens": limit}) from None

    def tool_offer(self) -> Tools | None:
        """The tools and tool_choice as the engine takes them; None when no tools are offered."""
        choice = self.tool_choice
        if not self.tools:
            if choice is not None and choice not in ("auto", "none"):
                raise _bad("tool_choice asks for a tool call, but no tools were given", "tool_choice")
            return None
        names = [t.function.name for t in self.tools]
        if len(set(names)) != len(names):
            raise _bad("two tools have the same name", "tools")
        functions = tuple(Tool(t.function.name, t.function.description or "",
                               json.dumps(t.function.parameters or {"type": "object", "properties": {}}),
                               bool(t.function.strict)) for t in self.tools)
        parallel = self.parallel_tool_calls is not False
        if isinstance(choice, NamedToolChoice):
            return Tools(functions, "required", choice.function.name, parallel)
        return Tools(functions, choice or "auto", None, parallel)

    def conversation(self) -> list[Message]:
        messages = []
        for i, m in enumerate(self.messages):
            text = m.text(f"messages.{i}.content")
            if len(text) > MAX_MESSAGE_CHARS:
                raise _bad(f"messages.{i}.content is {len(text)} characters; the limit is {MAX_MESSAGE_CHARS}",
                           f"messages.{i}.content")
            role = "system" if m.role == "developer" else m.role
            if m.tool_calls and role != "assistant":
                raise _bad(f"messages.{i}: only an assistant message has tool_calls", f"messages.{i}.tool_calls")
            if (role == "tool") != (m.tool_call_id is not None):
                raise _bad(f"messages.{i}: a tool message needs tool_call_id, and only a tool message has one",
                           f"messages.{i}.tool_call_id")
            if m.content is None and not m.tool_calls:
                raise _bad(f"messages.{i}.content is missing", f"messages.{i}.content")
            calls = tuple(ToolCall(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or ())
            messages.append(Message(role, text, calls, m.tool_call_id, m.name, m.images(f"messages.{i}.content")))
        return messages


def check_texts(items: list, param: str, max_chars: int, max_ids: int, *, empty: bool = True) -> None:
    """Each of a `prompt` or `input` list within its limit: a text of at most `max_chars` characters (not empty
    unless `empty`), or 1 to `max_ids` token ids; the first that is not is a 400 naming it."""
    for i, item in enumerate(items):
        if isinstance(item, str) and not item and not empty:
            raise ApiError(400, f"{param}[{i}] is an empty string; every text needs at least one character",
                           code="invalid_value", param=param)
        if isinstance(item, str) and len(item) > max_chars:
            raise ApiError(400, f"{param}[{i}] is {len(item)} characters; the limit is {max_chars}",
                           code="invalid_value", param=param)
        if isinstance(item, list) and not 0 < len(item) <= max_ids:
            raise ApiError(400, f"{param}[{i}] has {len(item)} token ids; send 1 to {max_ids}",
                           code="invalid_value", param=param)
