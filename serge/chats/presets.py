"""`Presets`: names people pick like a model's, each a base model with a system prompt, settings, knowledge and tools.

This is where a preset becomes settings. A request (of any dialect) or a chat naming a
preset gets its base model, its system prompt where the request has none of its own,
its sampling settings under the request's own (a field the request sets wins), and the
passages its knowledge collections give for the question; its tools (MCP servers, by
name) ride along for whoever runs tools. The engine never hears of presets: it is asked
for the base model.

Who sees what: a user sees their own presets and those an admin made for everyone; a
preset for everyone is made and changed by admins only. Names: an installed (or remote)
model's name is refused when a preset is made, and a model installed later under a
preset's name wins over it (the lists say the preset is `shadowed`); a user's own preset
wins over one for everyone of the same name. Nothing here knows of HTTP.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from serge.store.people.audit import note
from serge.access import is_hidden
from serge.chats.checks import MAX_SYSTEM_PROMPT_CHARS, InvalidChatInput, check_settings, check_text
from serge.chats.documents import ChatDocuments
from serge.chats.knowledge import Knowledge
from serge.engine import ChatRequest, Engine, Message, ModelInfo, ModelNotFound, SamplingParams
from serge.store import PresetNotFound, PresetRecord, PresetStore

NAME = re.compile(r"[A-Za-z0-9][\w.-]{0,63}")
MAX_PRESETS = 200  # a user's own; and as many for everyone
MAX_TOOLS = 16
TOOL_CHOICES = ("auto", "first", "always")  # as a chat's: when the model decides, first in every reply, every step
TOOL_NAME = re.compile(r"[\w.-]{1,64}")
TAG = ":latest"  # how Ollama's clients spell a name with no tag


class InvalidPresetInput(InvalidChatInput):
    """Something the user can fix; `param` names the field."""


class PresetForbidden(PermissionError):
    """A plain user asked to make or change a preset for everyone."""


class PresetModelMissing(ModelNotFound):
    """The preset's base model is no longer installed."""


@dataclass(frozen=True)
class PresetView:
    """A preset as the lists show it: the record, and whether it can be used now."""

    preset: PresetRecord
    state: str  # ready; model_missing (its base model was removed); shadowed (a model now has its name)


@dataclass(frozen=True)
class Applied:
    """A request once its model name is read: the model to ask, the request to send it, and the preset (if any)."""

    model: str | None
    request: ChatRequest
    preset: PresetRecord | None = None
    sources: tuple[dict, ...] = ()  # the passages its knowledge gave


def check_name(name: str) -> str:
    name = (name or "").strip()
    if not NAME.fullmatch(name):
        raise InvalidPresetInput(f"a preset's name is 1 to 64 letters, digits, '_', '-' or '.', starting with a "
                                 f"letter or digit (it is what a request puts in `model`); {name[:80]!r} is not",
                                 "name")
    return name


def _tool_choice(choice: str | None) -> str:
    if (choice or "auto") not in TOOL_CHOICES:
        raise InvalidPresetInput(f"tool_choice is one of {', '.join(TOOL_CHOICES)}; not {str(choice)[:20]!r}",
                                 "tool_choice")
    return choice or "auto"


def _tools(names: Sequence[str] | None) -> list[str]:
    names = list(dict.fromkeys(names or ()))
    if len(names) > MAX_TOOLS:
        raise InvalidPresetInput(f"tools lists {len(names)} servers; the limit is {MAX_TOOLS}", "tools")
    for name in names:
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise InvalidPresetInput(f"tools names MCP servers by their registered names (letters, digits, _ - .); "
                                     f"{str(name)[:80]!r} is not one", "tools")
    return names


class Presets:
    def __init__(self, store: PresetStore, engine: Engine, knowledge: Knowledge | None = None,
                 documents: ChatDocuments | None = None) -> None:
        self.store, self.engine, self.knowledge, self.documents = store, engine, knowledge, documents

    # --- what a name is -----------------------------------------------------------
    def _is_model(self, name: str) -> bool:
        try:
            self.engine.check_model(name)
            return True
        except ModelNotFound:
            return False

    def find(self, user: str, name: str | None) -> PresetRecord | None:
        """The preset a model name means to `user` (also as Ollama spells it, `name:latest`); None where the name
        is a model's (a model wins) or no preset's."""
        if not name or self._is_model(name):
            return None
        found = self.store.named(user, name)
        if found is None and name.endswith(TAG) and not self._is_model(bare := name[: -len(TAG)]):
            found = self.store.named(user, bare)
        return None if found is not None and is_hidden("preset", found.name) else found  # shared with others only

    def base_model(self, preset: PresetRecord) -> str:
        """The library name of the preset's model; PresetModelMissing once it is removed."""
        try:
            return self.engine.check_model(preset.model)
        except ModelNotFound:
            raise PresetModelMissing(f"preset {preset.name!r} uses the model {preset.model!r}, which is no longer "
                                     f"installed; pull it again, or point the preset at another model") from None

    def _state(self, preset: PresetRecord) -> str:
        if self._is_model(preset.name):
            return "shadowed"
        return "ready" if self._is_model(preset.model) else "model_missing"

    # --- the user's operations ------------------------------------------------------
    def _check_model(self, model: str) -> str:
        if not (model or "").strip():
            raise InvalidPresetInput("model is empty; a preset needs a base model (an installed chat model)", "model")
        name = self.engine.check_model(model.strip())  # ModelNotFound lists the installed ones
        if self.engine.info(name).kind != "chat":
            raise InvalidPresetInput(f"{name!r} is an embedding model; a preset needs a chat model", "model")
        return name

    def _check_free(self, name: str) -> None:
        if self._is_model(name):
            raise InvalidPresetInput(f"{name!r} is the name of an installed model, which would win over the preset; "
                                     f"pick another name", "name")

    def _collections(self, user: str, refs: Sequence[str] | None) -> list[str]:
        if not refs:
            return []
        if self.knowledge is None:
            raise InvalidPresetInput("this server has no knowledge collections", "knowledge")
        return self.knowledge.resolve(user, list(refs), "knowledge")

    def create(self, user: str, admin: bool, *, name: str, model: str, system_prompt: str | None = None,
               settings: dict | None = None, knowledge: Sequence[str] | None = None,
               tools: Sequence[str] | None = None, shared: bool = False, tool_choice: str = "auto") -> PresetRecord:
        """A preset of `user`'s own, or (`shared`, admins only) one for everyone."""
        if shared and not admin:
            raise PresetForbidden("only admins make presets for everyone; leave `shared` out to make your own")
        name = check_name(name)
        self._check_free(name)
        mine = [p for p in self.store.list(user) if p.shared == shared and (shared or p.owner == user)]
        if len(mine) >= MAX_PRESETS:
            raise InvalidPresetInput(f"there are {MAX_PRESETS} presets there, the limit; delete one first", "name")
        made = self.store.create(
            name=name, owner=None if shared else user, author=user, model=self._check_model(model),
            system_prompt=check_text(system_prompt, "system_prompt", MAX_SYSTEM_PROMPT_CHARS) or None,
            settings=check_settings(settings), knowledge=self._collections(user, knowledge), tools=_tools(tools),
            tool_choice=_tool_choice(tool_choice))
        if shared:  # for everyone: an admin's action, in the audit log
            note(self.store.db, "preset.add", f"{made.name} (on {made.model})")
        return made

    def list(self, user: str) -> list[PresetView]:
        return [PresetView(p, self._state(p)) for p in self.store.list(user) if not is_hidden("preset", p.name)]

    def among(self, user: str, models: Sequence[ModelInfo], *, ready_only: bool = False
              ) -> list[ModelInfo | PresetView]:
        """`models` (as the engine lists them) with the presets `user` may name right after the chat models: one per
        name (their own over everyone's), none shadowed by a model; `ready_only`: none whose model is gone."""
        seen: set[str] = set()
        views = []
        for view in self.list(user):
            if view.preset.name in seen or view.state == "shadowed" or (ready_only and view.state != "ready"):
                continue
            seen.add(view.preset.name)
            views.append(view)
        cut = max((i + 1 for i, m in enumerate(models) if m.kind == "chat"), default=0)
        return [*models[:cut], *views, *models[cut:]]

    def get(self, user: str, preset_id: str) -> PresetView:
        preset = self.store.get(user, preset_id)
        if is_hidden("preset", preset.name):  # shared only with groups the user is not in: as if it were not there
            raise PresetNotFound(f"there is no preset {preset_id!r}")
        return PresetView(preset, self._state(preset))

    def _changeable(self, user: str, admin: bool, preset_id: str) -> PresetRecord:
        preset = self.store.get(user, preset_id)  # another user's: not found
        if preset.shared and not admin:
            raise PresetForbidden(f"preset {preset.name!r} is for everyone; only admins change or delete it")
        return preset

    def update(self, user: str, admin: bool, preset_id: str, changes: dict) -> PresetRecord:
        """Change the fields given (name, model, system_prompt, settings, knowledge, tools, tool_choice)."""
        preset = self._changeable(user, admin, preset_id)
        checked: dict = {}
        if "name" in changes:
            checked["name"] = check_name(changes["name"])
            if checked["name"] != preset.name:
                self._check_free(checked["name"])
        if "model" in changes:
            checked["model"] = self._check_model(changes["model"])
        if "system_prompt" in changes:
            checked["system_prompt"] = check_text(changes["system_prompt"], "system_prompt",
                                                  MAX_SYSTEM_PROMPT_CHARS) or None
        if "settings" in changes:
            checked["settings"] = check_settings(changes["settings"])
        if "knowledge" in changes:  # the collections of whoever changes it, who becomes its author
            checked["knowledge"], checked["author"] = self._collections(user, changes["knowledge"]), user
        if "tools" in changes:
            checked["tools"] = _tools(changes["tools"])
        if "tool_choice" in changes:
            choice = _tool_choice(changes["tool_choice"])
            checked["tool_choice"] = None if choice == "auto" else choice
        changed = self.store.update(user, preset_id, **checked)
        if changed.shared:
            note(self.store.db, "preset.update", f"{changed.name}: {', '.join(sorted(checked))}")
        return changed

    def delete(self, user: str, admin: bool, preset_id: str) -> None:
        preset = self._changeable(user, admin, preset_id)
        self.store.delete(user, preset_id)
        if preset.shared:
            note(self.store.db, "preset.remove", preset.name)

    # --- a chat's export --------------------------------------------------------------
    def exported(self, user: str, name: str | None) -> dict | None:
        """The preset `name` means to `user`, as a chat's export carries it (its collections by name)."""
        preset = self.find(user, name)
        if preset is None:
            return None
        names = self.knowledge.searchable(preset.author, list(preset.knowledge))[1] if self.knowledge else {}
        return {"name": preset.name, "model": preset.model, "system_prompt": preset.system_prompt,
                "settings": preset.settings, "knowledge": [names[c] for c in preset.knowledge if c in names],
                "tools": list(preset.tools), "tool_choice": preset.tool_choice}

    def adopt(self, user: str, exported) -> str:
        """An imported chat's preset (`ExportedPreset`), made `user`'s own; its name. Collections `user` has no
        one of that name are left out; anything else refused is an InvalidPresetInput naming `chat.preset`."""
        mine = {c.name for c in self.knowledge.list(user)} if self.knowledge else set()
        try:
            return self.create(user, False, name=exported.name, model=exported.model,
                               system_prompt=exported.system_prompt, settings=exported.settings,
                               knowledge=[k for k in exported.knowledge if k in mine], tools=exported.tools,
                               tool_choice=exported.tool_choice).name
        except (InvalidChatInput, ModelNotFound) as exc:
            raise InvalidPresetInput(f"chat.preset: {exc}", "chat.preset") from None

    # --- what a preset does to a request --------------------------------------------
    def sampling(self, preset: PresetRecord, own: SamplingParams | None) -> SamplingParams:
        """The request's own settings over the preset's: a field the request sets wins."""
        base = SamplingParams(**preset.settings)
        return base if own is None else own.over(base)

    def given(self, preset: PresetRecord, model: str, history: list[Message]) -> tuple[str, tuple[dict, ...]]:
        """What the preset's collections (its author's) give for the last message of `history`: text and sources."""
        if not preset.knowledge or self.knowledge is None or self.documents is None:
            return "", ()
        in_collections, names = self.knowledge.searchable(preset.author, list(preset.knowledge))
        if not in_collections:
            return "", ()
        collections = {d: names[c] for d, c in in_collections.items()}
        given = self.documents.given(preset.author, model, [], history, collections)
        return given.text, tuple(given.sources)

    def apply(self, user: str, name: str | None, request: ChatRequest) -> Applied:
        """`request` as sent to `name`: unchanged for a model; for a preset, as `use` makes it."""
        preset = self.find(user, name)
        return Applied(name, request) if preset is None else self.use(preset, request)

    def use(self, preset: PresetRecord, request: ChatRequest) -> Applied:
        """`request` for the preset's base model, with its system prompt (unless the request has a system
        message), its settings under the request's own, and the passages its knowledge gives."""
        model = self.base_model(preset)
        messages = list(request.messages)
        if preset.system_prompt and not any(m.role == "system" for m in messages):
            messages.insert(0, Message("system", preset.system_prompt))
        sources: tuple[dict, ...] = ()
        if messages and messages[-1].role == "user":
            text, sources = self.given(preset, model, messages)
            if text:
                messages[-1] = replace(messages[-1], content=f"{text}\n\n{messages[-1].content}")
        return Applied(model, replace(request, messages=messages, params=self.sampling(preset, request.params)),
                       preset, sources)


__all__ = ["Applied", "InvalidPresetInput", "PresetForbidden", "PresetModelMissing", "PresetNotFound", "PresetView",
           "Presets", "check_name"]
