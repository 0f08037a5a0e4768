"""The knowledge API under /api/knowledge: an account's collections of files, HTTP only.

A file is sent to `/{id}/files` as multipart/form-data, as a chat's files are, and is
indexed in the background: a collection says how far (files indexed of all, passages
embedded), and each file its state (queued, indexing, indexed, failed with the reason,
cancelled) and its passages saved of all. A chat names collections in its settings
(`knowledge`), a message in its body (`knowledge`); another account's collection is a 404, unless its
owner shared it with a group of the caller's or with everyone (`PUT /{id}/shares`): then it is listed,
named and searched like the caller's own, read-only (changing it is a 403 `collection_read_only`).
"""

from __future__ import annotations

from fastapi import APIRouter, File, Request, Response, UploadFile
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from serge.chats import Knowledge
from serge.store import CollectionRecord, FileProgress
from serge.web.http.bodies import uploaded
from serge.web.http.context import RouteKind, services
from serge.web.http.auth import current_user, owner
from serge.web.api.chats import document_out

router = APIRouter(prefix="/api/knowledge", tags=["knowledge"])
UPLOADS = RouteKind("serge", upload=True).depends  # a route that takes a file


class CollectionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=200, description="One word (letters, digits, _ - .): `#name` picks it in the "
                                                  "chat box.")


def knowledge(request: Request) -> Knowledge:
    return services(request).knowledge


class SharesIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    groups: list[str] = Field(default_factory=list, max_length=100,
                              description="The groups (by name) whose members may read and search it.")
    everyone: bool = Field(False, description="Every user may read and search it.")


def collection_out(c: CollectionRecord, request: Request | None = None) -> dict:
    mine = request is None or c.owner == owner(request)
    return {"id": c.id, "name": c.name, "state": "indexing" if c.files_waiting else "ready",
            "files": c.files, "files_indexed": c.files_indexed, "files_waiting": c.files_waiting,
            "passages": c.passages, "created_at": c.created_at.isoformat(), "updated_at": c.updated_at.isoformat(),
            "mine": mine, "read_only": not mine and not (request is not None and current_user(request).admin),
            "shared_with": {"groups": list(c.shared_groups), "everyone": c.shared_with_everyone}}


def _admin(request: Request) -> bool:
    return current_user(request).admin


def file_out(f: FileProgress) -> dict:
    d = f.document
    return {**document_out(d), "pages": len(d.pages) or None, "state": d.state, "error": d.error,
            "passages": f.passages, "passages_total": d.chunks_total}


@router.post("", status_code=201, summary="Make a collection")
def create(body: CollectionIn, request: Request):
    return collection_out(knowledge(request).create(owner(request), body.name), request)


@router.get("", summary="Your collections and those shared with you, by name, with how far each is indexed")
def list_collections(request: Request):
    return {"data": [collection_out(c, request) for c in knowledge(request).list(owner(request))]}


@router.get("/{collection_id}", summary="A collection, with its files and how far each is indexed")
def get(collection_id: str, request: Request):
    service, user = knowledge(request), owner(request)
    return {**collection_out(service.get(user, collection_id), request),
            "data": [file_out(f) for f in service.files(user, collection_id)]}


@router.patch("/{collection_id}", summary="Rename a collection")
def rename(collection_id: str, body: CollectionIn, request: Request):
    return collection_out(knowledge(request).rename(owner(request), collection_id, body.name, _admin(request)),
                          request)


@router.delete("/{collection_id}", status_code=204,
               summary="Delete a collection with its files; chats that named it search it no more")
def delete(collection_id: str, request: Request):
    knowledge(request).delete(owner(request), collection_id, _admin(request))
    return Response(status_code=204)


@router.post("/{collection_id}/files", status_code=201,
             summary="Upload a file (text, Markdown, code, HTML, PDF or DOCX); it is indexed in the background",
             dependencies=[UPLOADS])
async def upload_file(collection_id: str, request: Request, file: UploadFile = File(description="The file itself.")):
    document = await run_in_threadpool(knowledge(request).upload, owner(request), collection_id, *await uploaded(file),
                                       _admin(request))
    return file_out(FileProgress(document, 0))


@router.get("/{collection_id}/files", summary="A collection's files, oldest first, with their indexing state")
def list_files(collection_id: str, request: Request):
    return {"data": [file_out(f) for f in knowledge(request).files(owner(request), collection_id)]}


@router.delete("/{collection_id}/files/{file_id}", status_code=204, summary="Delete a file of a collection")
def delete_file(collection_id: str, file_id: str, request: Request):
    knowledge(request).delete_file(owner(request), collection_id, file_id, _admin(request))
    return Response(status_code=204)


@router.post("/{collection_id}/reindex", summary="Read and embed every file of the collection again")
def reindex(collection_id: str, request: Request):
    return {"queued": knowledge(request).reindex(owner(request), collection_id, _admin(request))}


@router.post("/{collection_id}/cancel",
             summary="Stop indexing the collection's waiting files; what they saved stays searchable")
def cancel(collection_id: str, request: Request):
    return {"cancelled": knowledge(request).cancel(owner(request), collection_id, _admin(request))}


@router.put("/{collection_id}/shares", summary="Share a collection with groups and/or everyone (its owner, or an "
            "admin): their members may list, name and search it, read-only; no groups and not everyone: yours alone")
def share(collection_id: str, body: SharesIn, request: Request):
    return collection_out(knowledge(request).share(owner(request), collection_id, body.groups, body.everyone,
                                                   _admin(request)), request)
