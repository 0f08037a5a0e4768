"""The model library over HTTP, under /api/models: HTTP only.

Lists and shows models (installed and remote, loaded or not, with their facts),
pulls one from the Hugging Face hub in the background (progress readable, and
streamable as server-sent events, cancellable) and deletes one. A request names
a hub repo or a model name, never a path or a URL: importing from this
machine's disk is the CLI's alone. Pulling and deleting change what the server
holds for everyone, so they pass `require_admin`.
"""

from __future__ import annotations

import asyncio
import re

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from serge.engine import Engine, ModelInfo, PullStatus
from serge.web.http.auth import current_user
from serge.web.http.dialects import stream_response, sse
from serge.web.http.context import services
from serge.web.http.errors import ApiError

router = APIRouter(prefix="/api/models", tags=["models"])

_PULL_ID = re.compile(r"[0-9a-f]{32}")
_EVENT_POLL_S = 0.25
_KEEPALIVE_S = 15.0


def require_admin(request: Request) -> None:
    """Pulling and deleting change what the server holds for everyone: admins only (the
    local user, while Serge has no accounts, is one)."""
    if not current_user(request).admin:
        raise ApiError(403, "pulling and deleting models is for admins; ask one, or run `serge models pull` on the "
                            "server", code="admin_only")


class PullIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: str = Field(max_length=200, description="A hub repo with safetensors weights (org/name), one GGUF out "
                                                    "of a repo of quantizations (org/name:Q4_K_M), or a catalog name.")
    name: str | None = Field(None, max_length=200, description="Install it under this name; default: from source.")


def engine_of(request: Request) -> Engine:
    return request.app.state.engine


def model_out(m: ModelInfo) -> dict:
    f = m.facts
    return {
        "name": m.name, "kind": m.kind, "engine": m.engine, "source": m.source, "default": m.default, "loaded": m.loaded,
        "remote": m.remote, "busy": m.busy, "vision": m.vision, "created": int(m.created), "size_bytes": m.size_bytes,
        "memory_bytes": m.memory_bytes, "memory_estimated": not m.loaded,
        "format": f.format if f else None, "architecture": f.architecture if f else None,
        "parameters": f.parameters if f else None, "quantization": f.quantization if f else None,
        "context_length": f.context_length if f else None, "context_window": m.context_window, "chat_template": f.chat_template if f else None,
        "generation_defaults": m.defaults.model_dump(exclude_none=True) if m.defaults else {},
    }


def pull_out(p: PullStatus) -> dict:
    return {
        "id": p.id, "source": p.source, "name": p.name, "state": p.state, "stage": p.stage, "file": p.file,
        "bytes_done": p.bytes_done, "bytes_total": p.bytes_total, "percent": p.percent, "error": p.error,
        "started": p.started, "finished": p.finished,
    }


def _pull_id(pull_id: str) -> str:
    if not _PULL_ID.fullmatch(pull_id):
        raise ApiError(404, f"no pull {pull_id[:64]!r}: a pull id is 32 hexadecimal digits", code="pull_not_found",
                       param="pull_id")
    return pull_id


@router.get("", summary="Every model a request may name (installed, then remote), with facts and loaded state")
def list_models(request: Request):
    engine = engine_of(request)
    status = engine.status()
    return {
        "data": [model_out(m) for m in engine.models()],
        "loaded": [{"name": m.name, "engine": m.engine, "memory_bytes": m.memory_bytes, "busy": m.busy}
                   for m in status.loaded],
        "max_loaded_models": status.max_loaded_models,
        "memory_budget_bytes": status.memory_budget_bytes,
    }


@router.get("/pulls", summary="Pulls running and recently finished")
def list_pulls(request: Request):
    return {"data": [pull_out(p) for p in engine_of(request).pulls()]}


@router.post("/pulls", status_code=202, summary="Pull a model from the Hugging Face hub, in the background",
             dependencies=[Depends(require_admin)])
def start_pull(body: PullIn, request: Request):
    started = engine_of(request).start_pull(body.source, body.name)
    services(request).audit.note("model.pull", f"{body.source}{f' as {body.name}' if body.name else ''}")
    return pull_out(started)


@router.get("/pulls/{pull_id}", summary="How far a pull is: bytes done of the total, and its state")
def get_pull(pull_id: str, request: Request):
    return pull_out(engine_of(request).pull_status(_pull_id(pull_id)))


@router.get("/pulls/{pull_id}/events", summary="A pull's progress as server-sent events, until it ends")
async def pull_events(pull_id: str, request: Request):
    engine = engine_of(request)
    first = engine.pull_status(_pull_id(pull_id))  # 404 before the stream starts

    async def events():
        status, sent, quiet = first, None, 0.0
        while True:
            body = pull_out(status)
            if body != sent:
                yield sse(body, status.state if status.state != "running" else "progress")
                sent, quiet = body, 0.0
            elif quiet >= _KEEPALIVE_S:
                yield ": still pulling\n\n"
                quiet = 0.0
            if status.state != "running" or await request.is_disconnected():
                return
            await asyncio.sleep(_EVENT_POLL_S)
            quiet += _EVENT_POLL_S
            status = engine.pull_status(pull_id)

    return stream_response(events())  # leaving the page does not stop a pull


@router.delete("/pulls/{pull_id}", summary="Cancel a pull; nothing of it stays installed",
               dependencies=[Depends(require_admin)])
async def cancel_pull(pull_id: str, request: Request):
    return pull_out(await run_in_threadpool(engine_of(request).cancel_pull, _pull_id(pull_id)))


@router.get("/{name:path}", summary="One model: its facts, engine, memory and loaded state")
def get_model(name: str, request: Request):
    return model_out(engine_of(request).info(name))


@router.delete("/{name:path}", status_code=204, summary="Delete an installed model (409 while it answers)",
               dependencies=[Depends(require_admin)])
async def delete_model(name: str, request: Request):
    await run_in_threadpool(engine_of(request).remove, name)
    await run_in_threadpool(services(request).audit.note, "model.remove", name)
    return Response(status_code=204)
