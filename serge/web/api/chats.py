"""The chat API under /api/chats: HTTP only.

It parses requests, calls `ChatService`, and formats records as JSON or a reply
as server-sent events (`start`, which says how many of the oldest messages the
model could not see, then `delta` events with text and, for a model that thinks,
`reasoning` events with its thoughts, `tool` events as a tool call starts, waits for the
user's approval (`POST .../tool-calls/{call_id}`) and ends, then `done` with the saved message). A
client that goes away stops its reply, as `/stop` does. A file is
sent to `/files` (multipart/form-data, the one body here that is not JSON) and
attached to a message by the id that comes back; a reply's `sources` say which of
its passages the model was given.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Literal

from fastapi import APIRouter, File, Query, Request, Response, UploadFile
from fastapi.responses import PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from serge.chats import ChatExport, ChatService, Reply
from serge.chats import export_markdown
from serge.chats.knowledge import MAX_KNOWLEDGE_PER_MESSAGE
from serge.documents import MAX_FILES_PER_MESSAGE
from serge.engine import EngineBusy, ModelLoadFailed, SamplingParams
from serge.store import ChatRecord, DocumentRecord, MessageRecord
from serge.web.http.auth import current_user, owner
from serge.web.http.context import RouteKind, services
from serge.web.http.bodies import uploaded
from serge.web.pages.docs import EVENT_STREAM, MARKDOWN
from serge.web.http.dialects import stream_response, sse
from serge.web.http.errors import ApiError
from serge.web.http.request_log import note_generation

router = APIRouter(prefix="/api/chats", tags=["chats"])
UPLOADS = RouteKind("serge", upload=True).depends  # a route that takes a file
GENERATES = RouteKind("serge", model=True, streaming=True).depends  # a route that runs a model and may stream its reply
MAX_TOOL_SERVERS = 32


class ChatIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    title: str | None = Field(None, description="Defaults to the start of the first message.")
    model: str | None = Field(None, description="An installed model; the server's default when left out.")
    system_prompt: str | None = None
    settings: SamplingParams | None = Field(None, description="Generation settings for the chat's replies; "
                                                              "a field left out uses the model's default.")
    knowledge: list[str] | None = Field(None, max_length=MAX_KNOWLEDGE_PER_MESSAGE,
                                        description="Knowledge collections (by name or id) every reply searches.")
    tools: list[Annotated[str, Field(max_length=64)]] | None = Field(
        None, max_length=MAX_TOOL_SERVERS,
        description="Tool servers whose tools replies may call, by their registered name (`GET /api/tools` lists "
                    "those you may use; `serge` is the chat's own knowledge search).")
    tool_choice: Literal["auto", "first", "always"] | None = Field(
        None, description="auto (default): the model decides; first: the first step of each reply must call a "
                          "tool; always: every step must, until SERGE_TOOL_STEPS calls are made.")


class ChatPatch(ChatIn):
    """Only the fields sent are changed; `null` clears model or system prompt."""

    tool_approvals: list[Annotated[str, Field(max_length=200)]] | None = Field(
        None, max_length=256, description="The tools this chat runs without asking (`server/tool`), as an Always "
                                          "allow answer left them: send the list without one to revoke it (a tool "
                                          "is added only by answering Always allow).")


class MessageIn(BaseModel):
    content: str = Field(description="What the user writes.")
    attachments: list[str] = Field(default_factory=list, max_length=MAX_FILES_PER_MESSAGE,
                                   description="Ids of files uploaded to this chat (POST .../files) that come with "
                                               "the message.")
    knowledge: list[str] = Field(default_factory=list, max_length=MAX_KNOWLEDGE_PER_MESSAGE,
                                 description="Knowledge collections (by name or id) searched for this message, "
                                             "besides the chat's own.")


def service(request: Request) -> ChatService:
    return services(request).chats


@contextmanager
def reply_errors() -> Iterator[None]:
    """A reply that could not start: the user's message is kept, and the answer says how to go on."""
    try:
        yield
    except ModelLoadFailed as exc:
        raise ApiError(503, f"{exc}; your message is saved: pick another model in the chat's settings and press "
                            f"Regenerate", code="model_load_failed", param="model") from None
    except EngineBusy as exc:
        retry = max(1, round(exc.retry_after_s))
        raise ApiError(503, f"{exc}; your message is saved, try Regenerate in {retry} s", code="engine_busy",
                       headers={"Retry-After": str(retry)}) from None


def message_out(m: MessageRecord) -> dict:
    """The record as it is (its chat is the URL's), with its status."""
    body = {f.name: getattr(m, f.name) for f in dataclasses.fields(m) if f.name != "chat_id"}
    return {**body, "status": m.status, "alternatives": list(m.alternatives),
            "created_at": m.created_at.isoformat(), "updated_at": m.updated_at.isoformat()}


def chat_out(chat: ChatRecord, *, messages: bool = True) -> dict:
    body = {
        "id": chat.id, "title": chat.title, "model": chat.model, "system_prompt": chat.system_prompt,
        "settings": chat.settings, "knowledge": list(chat.knowledge), "tools": list(chat.tools),
        "tool_choice": chat.tool_choice, "tool_approvals": list(chat.tool_approvals),
        "created_at": chat.created_at.isoformat(),
        "updated_at": chat.updated_at.isoformat(),
    }
    if messages:
        body["messages"] = [message_out(m) for m in chat.messages]
    return body


def document_out(d: DocumentRecord) -> dict:
    return {"id": d.id, "name": d.name, "media_type": d.media_type, "size_bytes": d.size_bytes, "pages": len(d.pages),
            "chars": sum(len(p) for p in d.pages), "created_at": d.created_at.isoformat()}


def _event(kind: str, data: dict) -> str:
    return sse(data, kind)


def reply_events(request: Request, reply: Reply) -> StreamingResponse:
    note_generation(request, reply.model, reply.stream)

    async def events():
        yield _event("start", {
            "chat_id": reply.chat_id, "message_id": reply.message_id,
            "user_message": message_out(reply.user_message) if reply.user_message else None,
            "dropped_messages": reply.dropped_messages,
        })
        async for kind, value in reply.events():
            if kind in ("delta", "reasoning"):
                yield _event(kind, {"text": value})
            elif kind == "queued":
                yield _event("queued", {"ahead": value})
            elif kind == "tool":  # a call: shown when it starts, waits for approval, and ends
                yield _event("tool", {"call": value})
            else:
                yield _event("done", {"message": message_out(value)})

    # the client went away: stop, and the partial reply is kept (unless a call waits for its person's answer)
    return stream_response(events(), reply.leaving())


@router.post("", status_code=201, summary="Create a chat")
def create_chat(body: ChatIn, request: Request):
    return chat_out(service(request).create(owner(request), **body.model_dump(), user=current_user(request)))


@router.get("", summary="List chats, newest activity first; q searches titles and messages")
def list_chats(request: Request, q: str | None = Query(None, max_length=200)):
    chats = service(request).list(owner(request), q)
    return {"data": [chat_out(c, messages=False) for c in chats]}


@router.post("/import", status_code=201, summary="Import a chat from a JSON export")
def import_chat(body: ChatExport, request: Request):
    return chat_out(service(request).import_chat(owner(request), body, current_user(request)))


@router.get("/{chat_id}", summary="A chat with the messages of the branch on screen; its next reply's prompt is "
                                   "prefilled behind the answer (SERGE_WARM_CHATS, docs/chats.md)")
def get_chat(chat_id: str, request: Request):
    chats = service(request)
    chat = chats.get(owner(request), chat_id)
    chats.warm_later(owner(request), chat_id)  # in the background: its reader is about to write
    return chat_out(chat)


@router.patch("/{chat_id}", summary="Rename a chat, or change its model, system prompt or settings")
def patch_chat(chat_id: str, body: ChatPatch, request: Request):
    return chat_out(service(request).update(owner(request), chat_id, body.model_dump(exclude_unset=True),
                                            user=current_user(request)))


@router.delete("/{chat_id}", status_code=204, summary="Delete a chat and all its messages")
def delete_chat(chat_id: str, request: Request):
    service(request).delete(owner(request), chat_id)
    return Response(status_code=204)


@router.get("/{chat_id}/export", responses=MARKDOWN,
            summary="Download a chat as Markdown or JSON (JSON keeps every branch)")
def export_chat(chat_id: str, request: Request, format: Literal["md", "json"] = "json"):
    chats = service(request)
    if format == "md":
        chat = chats.get(owner(request), chat_id)
        return PlainTextResponse(export_markdown(chat), media_type="text/markdown; charset=utf-8", headers={
            "Content-Disposition": f'attachment; filename="chat-{chat_id}.md"'})
    body = chats.export(owner(request), chat_id)
    return Response(json.dumps(body, ensure_ascii=False, indent=2), media_type="application/json",
                    headers={"Content-Disposition": f'attachment; filename="chat-{chat_id}.json"'})


@router.post("/{chat_id}/files", status_code=201,
             summary="Upload a file (text, Markdown, code, HTML, PDF, DOCX, or an image for a vision model) "
                     "for the chat's messages to attach", dependencies=[UPLOADS])
async def upload_file(chat_id: str, request: Request, file: UploadFile = File(description="The file itself.")):
    document = await run_in_threadpool(service(request).attach, owner(request), chat_id, *await uploaded(file))
    return document_out(document)


@router.get("/{chat_id}/files", summary="The chat's files, oldest first")
def list_files(chat_id: str, request: Request):
    return {"data": [document_out(d) for d in service(request).files(owner(request), chat_id)]}


@router.get("/{chat_id}/files/{document_id}/image", response_class=Response, summary="An attached image's bytes",
            responses={200: {"content": {"image/png": {}, "image/jpeg": {}}, "description": "The image"}})
def file_image(chat_id: str, document_id: str, request: Request):
    """Only images (checked at upload to be one): no other file is served back, as the page never needs it."""
    document, data = service(request).image(owner(request), chat_id, document_id)
    return Response(data, media_type=document.media_type, headers={"Cache-Control": "private, max-age=3600"})


@router.post("/{chat_id}/messages", response_class=StreamingResponse, responses=EVENT_STREAM,
             summary="Send a message, with files of the chat attached and collections named; the reply streams back as server-sent events",
             dependencies=[GENERATES])
async def send_message(chat_id: str, body: MessageIn, request: Request):
    with reply_errors():
        reply = await run_in_threadpool(service(request).reply, owner(request), chat_id, body.content,
                                        body.attachments, body.knowledge, current_user(request))
    return reply_events(request, reply)


@router.post("/{chat_id}/regenerate", response_class=StreamingResponse, responses=EVENT_STREAM,
             summary="A new reply to the last message; the old one stays as an alternative", dependencies=[GENERATES])
async def regenerate(chat_id: str, request: Request):
    with reply_errors():
        reply = await run_in_threadpool(service(request).regenerate, owner(request), chat_id, current_user(request))
    return reply_events(request, reply)


@router.post("/{chat_id}/messages/{message_id}/edit", response_class=StreamingResponse, responses=EVENT_STREAM,
             summary="Edit one of your messages and resend it (a new branch)", dependencies=[GENERATES])
async def edit_and_resend(chat_id: str, message_id: str, body: MessageIn, request: Request):
    with reply_errors():
        reply = await run_in_threadpool(service(request).edit_and_resend, owner(request), chat_id, message_id,
                                        body.content, current_user(request))
    return reply_events(request, reply)


@router.post("/{chat_id}/messages/{message_id}/select", summary="Show another version of a message")
def select_alternative(chat_id: str, message_id: str, request: Request):
    return chat_out(service(request).select(owner(request), chat_id, message_id))


class ToolDecision(BaseModel):
    model_config = ConfigDict(extra="forbid")

    allow: bool = Field(description="true runs the call, false tells the model the user denied it.")
    always: bool = Field(False, description="With allow: run this tool in this chat from now on without asking.")


@router.get("/{chat_id}/tool-calls", summary="The tool calls of the reply in progress that wait for an answer")
def waiting_tool_calls(chat_id: str, request: Request):
    """In any process and any tab: a call waits in the database until someone allows or denies it."""
    return {"data": service(request).waiting_calls(owner(request), chat_id)}


@router.post("/{chat_id}/tool-calls/{call_id}", summary="Allow or deny a tool call the reply in progress waits on")
def decide_tool_call(chat_id: str, call_id: str, body: ToolDecision, request: Request):
    if not service(request).decide(owner(request), chat_id, call_id[:64], body.allow, body.always):
        raise ApiError(409, "no call of that id waits for an answer in this chat (it ran, was stopped, or the reply "
                            "ended)", code="no_waiting_call", param="call_id")
    return {"call_id": call_id, "allowed": body.allow, "always": body.always and body.allow}


@router.post("/{chat_id}/stop", summary="Stop the reply in progress; the partial text is kept")
def stop(chat_id: str, request: Request):
    message = service(request).stop(owner(request), chat_id)
    return {"stopped": message is not None, "message": message_out(message) if message else None}
