"""Export a chat as JSON (every branch, re-importable) or Markdown (the branch on screen), and
the shape an import must have.

A model label in an import (the chat's model, each reply's) must be a model name as the
library spells them (`check_name`): a label is shown on the page and in exports, so a
file may not put a path or markup there. A name that is not one is a 400 naming the field,
not silently dropped: an export Serge wrote always passes.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from serge.engine import InvalidModelName, check_name

from serge.store import ChatRecord, MessageRecord

FORMAT = "serge.chat"
VERSION = 1
MAX_IMPORT_MESSAGES = 10_000


def _label(value: str | None) -> str | None:
    """A model label as the library spells it; a ValueError (a 400 naming the field) for anything else."""
    if value is None:
        return None
    try:
        return check_name(value)
    except InvalidModelName as exc:
        raise ValueError(f"{exc}; a model label names a model") from None


Label = Annotated[str | None, AfterValidator(_label)]  # which model wrote a message, or a chat's model


class ExportedPreset(BaseModel):
    """The preset a chat's model names, as it was when exported: an import makes it the importer's own where
    they have no preset or model of that name (its collections by name: those the importer has)."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(max_length=64)
    model: Annotated[str, AfterValidator(_label)]
    system_prompt: str | None = None
    settings: dict = Field(default_factory=dict)
    knowledge: list[str] = Field(default_factory=list, max_length=8)
    tools: list[str] = Field(default_factory=list, max_length=16)
    tool_choice: Literal["auto", "first", "always"] = "auto"


class ExportedChat(BaseModel):
    model_config = ConfigDict(extra="ignore")

    title: str = Field("New chat", max_length=1000)
    model: Label = None
    preset: ExportedPreset | None = None  # where `model` names a preset
    system_prompt: str | None = None
    settings: dict = Field(default_factory=dict)
    # the MCP servers its replies may call, whether a reply must call one, and the tools "always allowed" in it
    # (`server/tool`): an import keeps those of the servers the importer may use here
    tools: list[str] = Field(default_factory=list, max_length=16)
    tool_choice: Literal["auto", "first", "always"] = "auto"
    tool_approvals: list[str] = Field(default_factory=list, max_length=256)
    created_at: datetime | None = None
    updated_at: datetime | None = None


class ExportedToolCall(BaseModel):
    """A tool a reply called, as stored with it: shown again on import, never run again."""

    model_config = ConfigDict(extra="ignore")

    id: str = Field(max_length=64)
    server: str = Field(max_length=64)
    tool: str = Field(max_length=200)
    arguments: str = Field("", max_length=100_000)  # JSON text, as the model wrote it
    state: Literal["waiting", "running", "done", "error", "denied", "stopped"] = "done"
    result: str = Field("", max_length=1_000_000)
    is_error: bool = False
    cut: bool = False


class ExportedMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str = Field(min_length=1, max_length=64)
    parent_id: str | None = Field(None, max_length=64)
    role: Literal["user", "assistant"]
    content: str
    reasoning: str | None = None  # exports before thinking was stored have none
    reasoning_tokens: int | None = Field(None, ge=0)
    model: Label = None
    settings: dict | None = None
    prompt_tokens: int | None = Field(None, ge=0)
    completion_tokens: int | None = Field(None, ge=0)
    seed: str | None = Field(None, max_length=24)
    queued_s: float | None = None
    ttft_s: float | None = None
    duration_s: float | None = None
    tokens_per_s: float | None = None
    finish_reason: Literal["stop", "length", "cancelled", "error", "interrupted"] | None = None
    complete: bool = True
    error: str | None = Field(None, max_length=10_000)
    dropped_messages: int | None = Field(None, ge=0)
    sources: list[dict] | None = Field(None, max_length=100)  # a reply's passages of files (the files stay behind)
    tool_calls: list[ExportedToolCall] | None = Field(None, max_length=64)  # a reply's tool calls and results
    created_at: datetime | None = None
    updated_at: datetime | None = None


class ChatExport(BaseModel):
    """A chat as `GET /api/chats/{id}/export?format=json` writes it and `POST /api/chats/import` reads it."""

    model_config = ConfigDict(extra="ignore")

    format: Literal["serge.chat"] = FORMAT
    version: Literal[1] = VERSION
    chat: ExportedChat
    current_id: str | None = None
    messages: list[ExportedMessage] = Field(default_factory=list, max_length=MAX_IMPORT_MESSAGES)


def export_json(chat: ChatRecord, messages: list[MessageRecord], preset: dict | None = None) -> dict:
    """What `ChatExport` reads back: each message as `ExportedMessage` has it, and the preset the chat's model
    names (`ExportedPreset`'s fields), if it names one."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "exported_at": datetime.now(UTC).isoformat(),
        "chat": {
            "title": chat.title,
            "model": chat.model,
            "preset": preset,
            "system_prompt": chat.system_prompt,
            "settings": chat.settings,
            "tools": list(chat.tools),
            "tool_choice": chat.tool_choice,
            "tool_approvals": list(chat.tool_approvals),
            "created_at": chat.created_at.isoformat(),
            "updated_at": chat.updated_at.isoformat(),
        },
        "current_id": chat.current_id,
        "messages": [
            {k: (v.isoformat() if isinstance(v := getattr(m, k), datetime) else v) for k in ExportedMessage.model_fields}
            for m in messages
        ],
    }


def export_markdown(chat: ChatRecord) -> str:
    lines = [f"# {chat.title}", ""]
    meta = [f"Model: {chat.model or 'default'}", f"Created: {chat.created_at:%Y-%m-%d %H:%M} UTC"]
    lines += ["_" + " · ".join(meta) + "_", ""]
    if chat.system_prompt:
        lines += ["## System", "", chat.system_prompt, ""]
    for m in chat.messages:
        heading = "You" if m.role == "user" else "Assistant"
        if m.role == "assistant" and m.model:
            heading += f" · {m.model}"  # which model wrote it: a chat may switch models between replies
        if m.role == "assistant" and not m.complete:
            heading += f" ({m.finish_reason or 'incomplete'})"
        lines += [f"## {heading}", ""]
        if m.reasoning:  # a thinking model's thoughts, quoted above its reply
            lines += ["> _Thoughts:_", *(f"> {line}".rstrip() for line in m.reasoning.strip().splitlines()), ""]
        for call in m.tool_calls or ():
            lines += [f"> _Called {call['server']}/{call['tool']}({call.get('arguments', '')}): {call.get('state')}_",
                      *(f"> {line}".rstrip() for line in str(call.get("result", "")).strip().splitlines()[:20]), ""]
        lines += [m.content, ""]
    return "\n".join(lines).rstrip() + "\n"
