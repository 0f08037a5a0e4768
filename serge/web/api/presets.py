"""The presets API under /api/presets: names people pick like a model's, HTTP only.

A preset is a base model with a system prompt, settings, knowledge collections and
tools; its name then works wherever a model's does (`model` in every dialect, a chat's
model, the page's picker). `shared: true` makes one for everyone (admins only); else it
is the caller's own, seen by nobody else (another user's is a 404). What a preset does
to a request is `serge.chats.presets`'; this module parses and formats.
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from serge.chats import Presets, PresetView
from serge.chats.knowledge import MAX_KNOWLEDGE_PER_MESSAGE
from serge.chats.presets import MAX_TOOLS
from serge.engine import SamplingParams
from serge.web.http.auth import current_user
from serge.web.http.context import services

router = APIRouter(prefix="/api/presets", tags=["presets"])


class PresetIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=200, description="What a request puts in `model` (letters, digits, _ - .); not an "
                                                  "installed model's name.")
    model: str = Field(max_length=256, description="The base model: an installed chat model.")
    system_prompt: str | None = Field(None, description="Used where a request or chat has no system prompt of its "
                                                        "own.")
    settings: SamplingParams | None = Field(None, description="Sampling settings; a request's own fields win.")
    knowledge: list[str] = Field(default_factory=list, max_length=MAX_KNOWLEDGE_PER_MESSAGE,
                                 description="Your knowledge collections (by name or id), searched for every "
                                             "question asked of the preset, whoever asks.")
    tools: list[str] = Field(default_factory=list, max_length=MAX_TOOLS,
                             description="MCP servers by their registered names, offered with the preset.")
    tool_choice: Literal["auto", "first", "always"] = Field(
        "auto", description="As a chat's: when the model decides, or a tool call first in every reply, or at every "
                            "step; a chat under the preset that sets none of its own takes it.")
    shared: bool = Field(False, description="For everyone (admins only); else your own, seen by you alone.")


class PresetPatch(BaseModel):
    """Only the fields sent are changed; `null` clears the system prompt."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, max_length=200)
    model: str | None = Field(None, max_length=256)
    system_prompt: str | None = None
    settings: SamplingParams | None = None
    knowledge: list[str] | None = Field(None, max_length=MAX_KNOWLEDGE_PER_MESSAGE)
    tools: list[str] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["auto", "first", "always"] | None = None


def presets(request: Request) -> Presets:
    return services(request).presets


def preset_out(view: PresetView) -> dict:
    p = view.preset
    return {"id": p.id, "name": p.name, "shared": p.shared, "model": p.model, "state": view.state,
            "system_prompt": p.system_prompt, "settings": p.settings, "knowledge": list(p.knowledge),
            "tools": list(p.tools), "tool_choice": p.tool_choice, "created_at": p.created_at.isoformat(),
            "updated_at": p.updated_at.isoformat()}


def _settings(value: SamplingParams | None) -> dict | None:
    return None if value is None else value.model_dump(mode="json", exclude_none=True)


@router.post("", status_code=201, summary="Make a preset: your own, or (admins, shared: true) one for everyone")
def create(body: PresetIn, request: Request):
    user, service = current_user(request), presets(request)
    made = service.create(user.id, user.admin, name=body.name, model=body.model, system_prompt=body.system_prompt,
                          settings=_settings(body.settings), knowledge=body.knowledge, tools=body.tools,
                          shared=body.shared, tool_choice=body.tool_choice)
    return preset_out(service.get(user.id, made.id))


@router.get("", summary="Your presets and those for everyone, by name; `state` says whether each can be used "
                        "(ready, model_missing, shadowed by an installed model of its name)")
def list_presets(request: Request):
    return {"data": [preset_out(v) for v in presets(request).list(current_user(request).id)]}


@router.get("/{preset_id}", summary="One preset")
def get(preset_id: str, request: Request):
    return preset_out(presets(request).get(current_user(request).id, preset_id))


@router.patch("/{preset_id}", summary="Change a preset (your own; one for everyone: admins only)")
def update(preset_id: str, body: PresetPatch, request: Request):
    user, service = current_user(request), presets(request)
    changes = body.model_dump(exclude_unset=True)
    if "settings" in changes:
        changes["settings"] = _settings(body.settings) or {}
    service.update(user.id, user.admin, preset_id, changes)
    return preset_out(service.get(user.id, preset_id))


@router.delete("/{preset_id}", status_code=204, summary="Delete a preset (your own; one for everyone: admins only); "
                                                         "chats that used it keep its name and answer with an error")
def delete(preset_id: str, request: Request):
    user = current_user(request)
    presets(request).delete(user.id, user.admin, preset_id)
    return Response(status_code=204)
