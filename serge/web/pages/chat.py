"""The chat and Models pages: server-rendered HTML (Jinja2) and the fragments their scripts swap in.

Reply text is turned into HTML only here, through `MarkdownRenderer` (raw HTML
off), and every other value goes through Jinja's autoescaping, so nothing a
model or a user writes can add markup or script. The scripts in static/ only
stream text (as text) and fetch these fragments; there is no front-end build.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from annotated_types import Ge, Gt, Le, Lt
from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, Response
from fastapi.templating import Jinja2Templates

from serge import __version__
from serge.accounts import LOCAL_USER
from serge.chats import MAX_MESSAGE_CHARS, MAX_SYSTEM_PROMPT_CHARS, ChatNotFound, ChatService
from serge.engine import SamplingParams, params_text, size_text
from serge.store import ChatRecord, MessageRecord
from serge.web.http.auth import current_user
from serge.web.http.context import services
from serge.web.pages.markdown import MarkdownRenderer

TEMPLATES = Path(__file__).parent.parent / "templates"
STATIC = Path(__file__).parent.parent / "static"

# The settings a person can change in the panel, with the step of their input.
PANEL_SETTINGS = (
    ("temperature", "Temperature", 0.05),
    ("top_p", "Top p", 0.05),
    ("top_k", "Top k", 1),
    ("max_new_tokens", "Max tokens", 1),
    ("repetition_penalty", "Repetition penalty", 0.05),
)


@dataclass(frozen=True)
class SettingField:
    name: str
    label: str
    description: str
    min: float | None
    max: float | None
    min_exclusive: bool
    step: float

    @property
    def range_text(self) -> str:
        low = "" if self.min is None else (f"above {self.min:g}" if self.min_exclusive else f"{self.min:g}")
        if self.max is None:
            return f"{low} or more" if not self.min_exclusive else low
        return f"{low} to {self.max:g}"


def setting_fields() -> list[SettingField]:
    """The panel's fields, with the ranges `SamplingParams` itself enforces."""
    fields = []
    for name, label, step in PANEL_SETTINGS:
        info = SamplingParams.model_fields[name]
        low = high = None
        exclusive = False
        for rule in info.metadata:
            if isinstance(rule, Ge):
                low = rule.ge
            elif isinstance(rule, Gt):
                low, exclusive = rule.gt, True
            elif isinstance(rule, Le):
                high = rule.le
            elif isinstance(rule, Lt):
                high = rule.lt
        fields.append(SettingField(name, label, info.description or "", low, high, exclusive, step))
    return fields


def _view(render: MarkdownRenderer, chat: ChatRecord | None) -> list[dict]:
    """Messages as the template shows them; the last one gets Regenerate."""
    if chat is None:
        return []
    shown = []
    for m in chat.messages:
        index = m.alternatives.index(m.id) if m.id in m.alternatives else 0
        shown.append({
            "m": m,
            "html": render.render(m.content) if m.role == "assistant" else None,
            "status": m.status,
            "stats": _stats(m),
            "thought": thought_text(m),
            "dropped": dropped_text(m.dropped_messages or 0),
            "position": index + 1,
            "count": len(m.alternatives) or 1,
            "previous": m.alternatives[index - 1] if index > 0 else None,
            "next": m.alternatives[index + 1] if index + 1 < len(m.alternatives) else None,
            "regenerate": m.id == chat.messages[-1].id,  # a new reply to the last question
        })
    return shown


def dropped_text(count: int) -> str:
    """What a reply says when the model could not see the whole chat (the page's script says the same)."""
    if not count:
        return ""
    oldest = "the oldest message" if count == 1 else f"the {count} oldest messages"
    return f"written without {oldest}: the chat is longer than the model's context"


def thought_text(m: MessageRecord) -> str:
    """The line a reply's folded thoughts show: how long the model thought (the page's script says "Thinking…")."""
    if not m.reasoning_tokens:
        return "Thought"
    text = f"Thought for {m.reasoning_tokens} tokens"
    if m.tokens_per_s:
        text += f" · about {max(1, round(m.reasoning_tokens / m.tokens_per_s))} s"
    return text


def cited(sources: list[dict]) -> list[dict]:
    """A reply's sources as the page lists them: one per file and page, in the order first used, its passages
    together on hover (the stored sources, and the API, keep each passage with its score)."""
    places: dict[tuple, dict] = {}
    for s in sources:
        key = (s.get("file"), s.get("page"), s.get("collection"))
        place = places.setdefault(key, {"file": key[0], "page": key[1], "collection": key[2], "passages": []})
        place["passages"].append(s.get("passage") or "the whole file")
    return list(places.values())


def _stats(m: MessageRecord) -> str:
    if m.role != "assistant" or m.completion_tokens is None:
        return ""
    text = f"{m.completion_tokens} tokens"
    if m.tokens_per_s:
        text += f" · {m.tokens_per_s:.1f} tokens/s"
    return text


def build_pages() -> APIRouter:
    router = APIRouter(include_in_schema=False)
    templates = Jinja2Templates(directory=str(TEMPLATES))
    templates.env.filters.update(size=size_text, params=params_text, cited=cited)
    render = MarkdownRenderer()
    pygments_css = render.stylesheet()

    def chats(request: Request) -> ChatService:
        return services(request).chats

    def image_ids(request: Request, chat: ChatRecord | None) -> set[str]:
        """The chat's attachments that are images: each shows as a thumbnail in its message."""
        service = chats(request)
        if chat is None or service.documents is None:
            return set()
        return {d.id for d in service.files(current_user(request).id, chat.id) if d.media_type.startswith("image/")}

    def page(request: Request, chat: ChatRecord | None, status_code: int = 200, missing: str | None = None):
        service = chats(request)
        engine = service.engine
        user = current_user(request)
        return templates.TemplateResponse(request, "chat.html", {
            "user": user,
            "local": user is LOCAL_USER,
            "chat": chat,
            "messages": _view(render, chat),
            "images": image_ids(request, chat),
            "chats": service.list(user.id),
            "collections": services(request).knowledge.list(user.id),
            "tool_servers": service.tools.usable(user) if service.tools is not None else [],
            "models": engine.models(),
            "presets": services(request).presets.among(user.id, []),  # theirs and everyone's, one per name
            "default_model": engine.default_model,
            "fields": setting_fields(),
            "max_message_chars": MAX_MESSAGE_CHARS,
            "max_system_prompt_chars": MAX_SYSTEM_PROMPT_CHARS,
            "missing": missing,
            "version": __version__,
        }, status_code=status_code)

    @router.get("/", response_class=HTMLResponse)
    def new_chat(request: Request):
        return page(request, None)

    def own_chat(request: Request, chat_id: str) -> ChatRecord | None:
        """The user's chat of that id; None where there is none (deleted, or another's)."""
        try:
            return chats(request).get(current_user(request).id, chat_id)
        except ChatNotFound:
            return None

    @router.get("/c/{chat_id}", response_class=HTMLResponse)
    def show_chat(chat_id: str, request: Request):
        if (chat := own_chat(request, chat_id)) is None:
            return page(request, None, 404, missing="This chat does not exist (it may have been deleted).")
        chats(request).warm_later(current_user(request).id, chat_id)  # its reader is about to write
        return page(request, chat)

    @router.get("/c/{chat_id}/conversation", response_class=HTMLResponse)
    def conversation(chat_id: str, request: Request):
        if (chat := own_chat(request, chat_id)) is None:
            return HTMLResponse("", status_code=404)
        chats(request).warm_later(current_user(request).id, chat_id)  # shown again after a reply: the next is near
        return templates.TemplateResponse(request, "_conversation.html", {
            "chat": chat, "messages": _view(render, chat), "images": image_ids(request, chat)})

    @router.get("/fragments/chats", response_class=HTMLResponse)
    def chat_list(request: Request, q: str | None = Query(None, max_length=200), current: str | None = None):
        found = chats(request).list(current_user(request).id, q)
        return templates.TemplateResponse(request, "_chat_list.html",
                                          {"chats": found, "current": current, "query": q})

    def models_context(request: Request) -> dict:
        engine = chats(request).engine
        models, status = engine.models(), engine.status()
        return {
            "installed": [m for m in models if not m.remote],
            "remote": [m for m in models if m.remote],
            "loaded": status.loaded,
            "loaded_bytes": sum(m.memory_bytes for m in status.loaded),
            "max_loaded": status.max_loaded_models,
            "budget_bytes": status.memory_budget_bytes,
        }

    @router.get("/models", response_class=HTMLResponse)
    def models_page(request: Request):
        return templates.TemplateResponse(request, "models.html", {**models_context(request), "version": __version__})

    @router.get("/knowledge", response_class=HTMLResponse)
    def knowledge_page(request: Request):
        return templates.TemplateResponse(request, "knowledge.html", {"version": __version__})

    @router.get("/fragments/models", response_class=HTMLResponse)
    def models_fragment(request: Request):
        return templates.TemplateResponse(request, "_models.html", models_context(request))

    @router.get("/pygments.css")
    def code_colours():
        return Response(pygments_css, media_type="text/css", headers={"Cache-Control": "max-age=3600"})

    return router
