"""The body of `/v1/responses` (OpenAI's Responses API), and its translation into the engine's values.

`input` is a string or a list of items (`responses.items`: messages, function calls and
their outputs, reasoning items, MCP items). Tools are OpenAI's flat function tools and its
`mcp` tool (responses.mcp: a registered server, run by Serge); hosted tools (`HOSTED`, and
any other type that is not `function` or `mcp`) are left out of what the model is offered,
never refused. `reasoning.effort` none or minimal asks a model that thinks not
to, where its template allows. Unknown top-level fields are a 400 naming them. This
module formats no replies.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, field_validator

from serge.chats import MAX_MESSAGE_CHARS
from serge.engine import MAX_TOP_LOGPROBS, RESPONSES_NAMES, ResponseFormat, SamplingParams, Tool, Tools
from serge.web.http.dialects import StrictRequest, TOOL_TEXT, refused_settings, think_for
from serge.web.http.errors import describe_validation
from serge.web.openai.chat_models import MAX_TOOLS, NO_EFFECT
from serge.web.responses.items import InputItem, ReasoningItem, canonical, invalid, or_a_string
from serge.web.responses.mcp import McpChoice, McpToolIn

MAX_INPUT_ITEMS = 1000
# Tools OpenAI runs on its own servers (or that need a client protocol Serge's models do not speak):
# left out of what the model is offered, named in the request log. Any other non-function type is too.
HOSTED = ("web_search", "web_search_preview", "file_search", "code_interpreter", "computer_use_preview",
          "computer", "image_generation", "local_shell", "shell", "custom", "apply_patch", "tool_search")
# Accepted and without effect here (the API reference says so field by field).
HARMLESS = ("reasoning.summary", "include (but message.output_text.logprobs)", "prompt_cache_key",
            "prompt_cache_retention", "client_metadata", "safety_identifier", "metadata", "user", "service_tier",
            "stream_options", "text.verbosity", "background: false")
LOGPROBS = "message.output_text.logprobs"


class FunctionTool(StrictRequest):
    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = Field(None, description=TOOL_TEXT)
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
    return kind if kind in ("function", "mcp") else "other"


ToolIn = Annotated[Annotated[FunctionTool, Tag("function")] | Annotated[McpToolIn, Tag("mcp")]
                   | Annotated[OtherTool, Tag("other")], Discriminator(_tool_kind)]


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
    return kind if kind in ("function", "allowed_tools", "mcp") else "hosted"


ToolChoiceIn = Annotated[
    Annotated[Literal["auto", "none", "required"], Tag("mode")] | Annotated[FunctionChoice, Tag("function")]
    | Annotated[AllowedTools, Tag("allowed_tools")] | Annotated[McpChoice, Tag("mcp")]
    | Annotated[HostedChoice, Tag("hosted")], Discriminator(_choice_kind)]


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
            raise invalid("text.format of type json_schema needs name and schema", "text.format")
        try:
            return ResponseFormat.model_validate({"type": "json_schema", "json_schema": {
                "name": self.name, "schema": self.schema_, "description": self.description, "strict": self.strict}})
        except ValidationError as exc:
            message, _ = describe_validation(exc.errors())
            raise invalid(f"text.format: {message}", "text.format") from None


class TextConfig(StrictRequest):
    format: TextFormat | None = Field(None, description="text (the default), json_object or json_schema: enforced "
                                                        "by constrained decoding.")
    verbosity: Literal["low", "medium", "high"] | None = Field(None, description=NO_EFFECT)


class Reasoning(StrictRequest):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = Field(None, description=(
        "For a model that thinks: none or minimal asks its template not to (where the template allows); any other "
        "value lets it think. Its thoughts come back as reasoning items."))
    summary: str | None = Field(None, max_length=16, description=NO_EFFECT)
    generate_summary: str | None = Field(None, max_length=16, description=NO_EFFECT)


class StreamOptions(StrictRequest):
    include_obfuscation: bool | None = Field(None, description=NO_EFFECT)


class CreateResponse(StrictRequest):
    model: str | None = Field(None, description="An installed model; the server's default when left out.")
    input: list[InputItem] = Field(min_length=1, max_length=MAX_INPUT_ITEMS, json_schema_extra=or_a_string,
                                   description="A user message as a string, or a list of items.")
    instructions: str | None = Field(None, max_length=MAX_MESSAGE_CHARS, description=(
        "A system message put first; not carried over from previous_response_id, as OpenAI's."))
    previous_response_id: str | None = Field(None, max_length=64, description=(
        "Continue a stored response: its chain's input and output come before this input."))
    store: bool = Field(True, description="Keep the response for retrieval and previous_response_id (the default).")
    stream: bool = False
    stream_options: StreamOptions | None = None
    tools: list[ToolIn] | None = Field(None, max_length=MAX_TOOLS, description=(
        f"Function tools, and mcp tools naming MCP servers registered in Serge (server_label), which Serge runs. "
        f"Hosted tools ({', '.join(HOSTED)}, and any other type but function and mcp) are left out of what the "
        f"model is offered and named in the request log."))
    tool_choice: ToolChoiceIn | None = Field(None, description="auto, none, required, {type: function, name}, "
                                                               "{type: mcp, server_label, name} or {type: "
                                                               "allowed_tools, mode, tools}; a hosted tool is a "
                                                               "400.")
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
    reasoning: Reasoning | None = Field(None, description="effort none or minimal: no thinking; summary has no "
                                                          "effect (thoughts come whole, as reasoning_text).")
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

    def think(self) -> bool | None:
        return think_for(self.reasoning.effort if self.reasoning else None)

    def response_format(self) -> ResponseFormat | None:
        return self.text.format.response_format() if self.text and self.text.format else None

    def functions(self) -> list[FunctionTool]:
        return [t for t in self.tools or () if isinstance(t, FunctionTool)]

    def mcp_tools(self) -> list[McpToolIn]:
        return [t for t in self.tools or () if isinstance(t, McpToolIn)]

    def uses_mcp(self) -> bool:
        """The request offers MCP tools, or answers an approval request of one."""
        return bool(self.mcp_tools()) or any(getattr(i, "type", None) == "mcp_approval_response" for i in self.input)

    def left_out(self) -> list[str]:
        """The hosted tools asked for, which the model is not offered."""
        return [t.type for t in self.tools or () if isinstance(t, OtherTool)]

    def tool_offer(self, mcp: dict[str, str] | None = None, mcp_tools: tuple[Tool, ...] = ()) -> Tools | None:
        """The function tools (and `mcp_tools`, the MCP servers' tools offered, `mcp` their name -> server) and
        tool_choice as the engine takes them; None when none are offered."""
        choice, functions = self.tool_choice, self.functions()
        if isinstance(choice, HostedChoice):
            raise invalid(f"tool_choice asks for the hosted tool {choice.type!r}, which Serge cannot run; "
                       f"choose auto, none, required, a function or an mcp server's tool", "tool_choice")
        names = [t.name for t in functions]
        if len(set(names)) != len(names):
            raise invalid("two tools have the same name", "tools")
        if isinstance(choice, McpChoice):
            theirs = [name for name, server in (mcp or {}).items() if server == choice.server_label]
            if choice.name is not None and choice.name not in theirs or not theirs:
                raise invalid(f"tool_choice asks for {choice.name or 'a tool'!r} of {choice.server_label!r}, which "
                              f"is not among the mcp tools offered", "tool_choice")
            offered = tuple(t for t in mcp_tools if t.name in theirs)
            return Tools(offered, "required", choice.name, self.parallel_tool_calls is not False)
        if not functions and mcp_tools:
            if isinstance(choice, (FunctionChoice, AllowedTools)):
                raise invalid("tool_choice names a function, but no function tools were given", "tool_choice")
            return Tools(mcp_tools, choice or "auto", None, self.parallel_tool_calls is not False)
        if not functions:
            if choice is not None and choice not in ("auto", "none"):
                raise invalid("tool_choice asks for a tool call, but no function tools were given", "tool_choice")
            return None
        parallel = self.parallel_tool_calls is not False
        if isinstance(choice, AllowedTools):
            allowed = {t.get("name") for t in choice.tools if t.get("type") == "function"}
            if unknown := allowed - set(names):
                raise invalid(f"tool_choice.tools names {sorted(unknown)}, which are not among the tools",
                           "tool_choice.tools")
            functions = [t for t in functions if t.name in allowed]
            choice = choice.mode if functions else "none"
        offered = tuple(Tool(t.name, t.description or "",
                             json.dumps(t.parameters or {"type": "object", "properties": {}}), bool(t.strict))
                        for t in functions) + mcp_tools
        if isinstance(choice, FunctionChoice):
            return Tools(offered, "required", choice.name, parallel)
        return Tools(offered, choice or "auto", None, parallel)

    def input_items(self) -> list[dict]:
        """This request's input, as Serge stores and lists it."""
        return [canonical(item, i) for i, item in enumerate(self.input) if not isinstance(item, ReasoningItem)]


