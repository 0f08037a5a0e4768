"""Ollama's API for the model library: `/api/tags`, `/api/show`, `/api/ps`, `/api/version`, `/api/pull`, `/api/delete`.

HTTP only, over the engine's door (`models`, `info`, `status`, `start_pull`,
`pull_status`, `remove`): models (and the caller's presets whose base model is installed, as
models made FROM it) are listed under Ollama's `name:tag` spelling
(`ollama_name`) with Ollama's details (family, parameter size, quantization, a
digest that stays the same while the installed model does). A pull streams
Serge's progress as Ollama's status records; pulling and deleting pass
`require_admin`, as on the Models page. A pull whose client goes away is
cancelled, as Ollama cancels it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from datetime import UTC, datetime

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from serge.engine import OLLAMA_OPTIONS, Engine, ModelInfo, ModelNotFound, PullStatus, SamplingParams, params_text
from serge.chats import PresetView
from serge.store import PresetRecord
from serge.web.http.auth import current_user
from serge.web.http.errors import ApiError
from serge.web.api.models import require_admin
from serge.web.http.context import services
from serge.web.ollama.models import (ERRORS_DOC, NDJSON, OllamaModelRequest, OllamaPullRequest, library_name,
                                     ollama_name, pull_spec, stream_doc)

router = APIRouter()  # its tag comes from ollama.api, which includes it

OLLAMA_VERSION = "0.12.0"  # the Ollama release whose API this one follows, for clients that check
NEVER = "2318-01-01T00:00:00Z"  # expires_at of a loaded model: Serge unloads by its memory budget, not a clock
_POLL_S = 0.25
_DTYPES = {"float16": "F16", "bfloat16": "BF16", "float32": "F32"}


class OllamaModelDetails(BaseModel):
    parent_model: str = ""
    format: str = ""
    family: str = ""
    families: list[str] | None = None
    parameter_size: str = ""
    quantization_level: str = ""


class OllamaListedModel(BaseModel):
    name: str
    model: str
    modified_at: str
    size: int
    digest: str
    details: OllamaModelDetails


class OllamaTags(BaseModel):
    models: list[OllamaListedModel]


class OllamaShow(BaseModel):
    modelfile: str
    parameters: str
    template: str
    license: str
    details: OllamaModelDetails
    model_info: dict
    capabilities: list[str]
    modified_at: str


class OllamaRunningModel(OllamaListedModel):
    expires_at: str
    size_vram: int
    context_length: int


class OllamaPs(BaseModel):
    models: list[OllamaRunningModel]


class OllamaVersion(BaseModel):
    version: str


def _engine(request: Request) -> Engine:
    return request.app.state.engine


def _family(m: ModelInfo) -> str:
    arch = (m.facts.architecture if m.facts else None) or ""
    for suffix in ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel", "Model"):
        if arch.endswith(suffix) and arch != suffix:
            arch = arch[: -len(suffix)]
            break
    return arch.lower()


def details(m: ModelInfo) -> OllamaModelDetails:
    f = m.facts
    if f is None:  # a remote model: its server knows
        return OllamaModelDetails(format="remote")
    family = _family(m)
    quantization = f.quantization or ""
    return OllamaModelDetails(format="gguf" if f.format == "gguf" else "safetensors", family=family,
                        families=[family] if family else None, parameter_size=params_text(f.parameters, ""),
                        quantization_level=_DTYPES.get(quantization, quantization))


def digest(m: ModelInfo) -> str:
    """A stable hash of the installed model: the same until it is removed or installed again."""
    return hashlib.sha256(f"{m.name}\n{m.source}\n{m.size_bytes}\n{m.created}".encode()).hexdigest()


def _modified(m: ModelInfo) -> str:
    return datetime.fromtimestamp(m.created, UTC).isoformat().replace("+00:00", "Z")


def listed(m: ModelInfo) -> dict:
    name = ollama_name(m.name)
    return {"name": name, "model": name, "modified_at": _modified(m), "size": m.size_bytes or 0,
            "digest": digest(m), "details": details(m)}


def parameters(defaults: SamplingParams | None) -> str:
    """A model's own generation settings, as Ollama's `parameters` text (`temperature 0.2`, one per line)."""
    if defaults is None:
        return ""
    lines = []
    for theirs, ours in OLLAMA_OPTIONS.items():
        value = getattr(defaults, ours)
        for one in (value if isinstance(value, tuple) else () if value is None else (value,)):
            lines.append(f"{theirs:<30} {one!r}" if isinstance(one, str) else f"{theirs:<30} {one}")
    return "\n".join(lines)


@router.get("/api/version", response_model=OllamaVersion, summary="Ollama: the API version Serge follows",
             responses=ERRORS_DOC)
def version():
    return {"version": OLLAMA_VERSION}


@router.get("/api/tags", response_model=OllamaTags, summary="Ollama: the models a request may name",
             responses=ERRORS_DOC)
def tags(request: Request):
    engine = _engine(request)
    found = services(request).presets.among(current_user(request).id, engine.models(), ready_only=True)
    return {"models": [_preset_listed(engine, m) if isinstance(m, PresetView) else listed(m) for m in found]}


def _preset_listed(engine: Engine, view: PresetView) -> dict:
    """A preset as Ollama lists a model made FROM another: the base model's details, it as `parent_model`."""
    p, base = view.preset, engine.info(view.preset.model)
    name = ollama_name(p.name)
    return {"name": name, "model": name, "modified_at": p.updated_at.isoformat().replace("+00:00", "Z"),
            "size": base.size_bytes or 0,
            "digest": hashlib.sha256(f"preset\n{p.id}\n{p.updated_at}".encode()).hexdigest(),
            "details": details(base).model_copy(update={"parent_model": ollama_name(base.name)})}


@router.post("/api/show", response_model=OllamaShow, summary="Ollama: one model's details",
              responses=ERRORS_DOC)
async def show(body: OllamaModelRequest, request: Request):
    engine = _engine(request)
    body.ignored("/api/show")
    presets = services(request).presets
    if (preset := await run_in_threadpool(presets.find, current_user(request).id, body.named)) is not None:
        return _show_preset(engine.info(presets.base_model(preset)), preset)
    m = engine.info(await run_in_threadpool(library_name, engine, body.named))
    family = _family(m) or "general"
    info: dict = {"general.architecture": family}
    if m.facts and m.facts.parameters:
        info["general.parameter_count"] = m.facts.parameters
    window = m.context_window or (m.facts.context_length if m.facts else None)
    if window:
        info[f"{family}.context_length"] = window
    return {"modelfile": f"# {ollama_name(m.name)}: served by Serge from {m.source}\n",
            "parameters": parameters(m.defaults), "template": "", "license": "", "details": details(m),
            "model_info": info,
            "capabilities": ["embedding"] if m.kind == "embedding" else ["completion", "tools"] + ["vision"] * m.vision,
            "modified_at": _modified(m)}


def _show_preset(m: ModelInfo, preset: PresetRecord) -> dict:
    """A preset as Ollama shows a model made by a Modelfile: FROM its base, its SYSTEM and PARAMETERs."""
    settings = SamplingParams(**preset.settings)
    system = f'SYSTEM """{preset.system_prompt}"""\n' if preset.system_prompt else ""
    lines = "".join(f"PARAMETER {line}\n" for line in parameters(settings).splitlines())
    base = ollama_name(m.name)
    return {"modelfile": f"FROM {base}\n{system}{lines}", "parameters": parameters(settings.over(m.defaults)),
            "template": "", "license": "", "details": details(m).model_copy(update={"parent_model": base}),
            "model_info": {}, "capabilities": ["completion", "tools"] + ["vision"] * m.vision,
            "modified_at": preset.updated_at.isoformat().replace("+00:00", "Z")}


@router.get("/api/ps", response_model=OllamaPs, summary="Ollama: the models loaded now", responses=ERRORS_DOC)
def ps(request: Request):
    engine = _engine(request)
    status = engine.status()
    on_gpu = status.device.startswith("cuda")
    running = []
    for loaded in status.loaded:
        try:
            m = engine.info(loaded.name)
        except ModelNotFound:  # removed since
            continue
        running.append({**listed(m), "expires_at": NEVER, "size": loaded.memory_bytes,
                        "size_vram": loaded.memory_bytes if on_gpu else 0, "context_length": loaded.context_window})
    return {"models": running}


def _progress(p: PullStatus) -> dict:
    if p.state == "running" and p.file:
        return {"status": f"pulling {p.file}", "digest": p.file, "total": p.bytes_total or 0,
                "completed": p.bytes_done}
    return {"status": p.stage}


_FINISHED = ({"status": "verifying sha256 digest"}, {"status": "writing manifest"}, {"status": "success"})


@router.post("/api/pull", summary="Ollama: pull a model into the library (admins; progress as NDJSON)",
             dependencies=[Depends(require_admin)], responses=stream_doc("Progress"),
             description="`model` is a catalog name or a hub repo (org/name, org/name:QUANT; Ollama's "
                         "hf.co/org/name:QUANT too); `:latest` is dropped. A model installed already answers "
                         "success at once. The pull stops if the client goes away, as Ollama's does.")
async def pull(body: OllamaPullRequest, request: Request):
    engine = _engine(request)
    body.ignored("/api/pull")
    if not (body.model or body.name):
        raise ApiError(400, "model is required", code="invalid_value", param="model")
    spec = pull_spec(body.model or body.name)
    try:
        await run_in_threadpool(engine.check_model, spec)
        installed = True
    except ModelNotFound:
        installed = False
    pull_id, ours = None, False
    if not installed:
        running = {p.id for p in engine.pulls() if p.state == "running"}
        started = await run_in_threadpool(engine.start_pull, spec)
        pull_id, ours = started.id, started.id not in running

    async def progress():
        """Each change of the pull, until it ends; a pull this request started is cancelled if it goes away."""
        sent = None
        try:
            while pull_id is not None:
                status = engine.pull_status(pull_id)
                record = _progress(status)
                if record != sent:
                    yield record
                    sent = record
                if status.state != "running":
                    if status.state != "done":
                        yield {"error": status.error or f"the pull was {status.state}"}
                        return
                    break
                await asyncio.sleep(_POLL_S)
            for record in _FINISHED:
                yield record
        finally:
            status = engine.pull_status(pull_id) if pull_id else None
            if ours and status is not None and status.state == "running":
                asyncio.get_running_loop().run_in_executor(None, engine.cancel_pull, pull_id)

    if body.stream is False:
        last: dict = {}
        async for record in progress():
            last = record
        if "error" in last:
            raise ApiError(502, last["error"], code="pull_failed", param="model")
        return JSONResponse(last)

    async def lines():
        yield '{"status": "pulling manifest"}\n'
        async for record in progress():
            yield json.dumps(record) + "\n"

    return StreamingResponse(lines(), media_type=NDJSON)


@router.delete("/api/delete", summary="Ollama: delete a model from the library (admins)",
               dependencies=[Depends(require_admin)], response_class=Response,
               responses={200: {"description": "Deleted; the body is empty, as Ollama's."}, **ERRORS_DOC})
async def delete(body: OllamaModelRequest, request: Request):
    engine = _engine(request)
    body.ignored("/api/delete")
    await run_in_threadpool(engine.remove, await run_in_threadpool(library_name, engine, body.named))
    return Response(status_code=200)
