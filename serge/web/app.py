"""The app factory: wires settings, the engine and the routers into one FastAPI app.

The default model starts loading in the background as soon as the server starts,
so the port answers at once and `/api/health` says `loading` until it is ready.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from fastapi.staticfiles import StaticFiles

from serge import __version__
from serge.engine import Engine
from serge.services import Services
from serge.settings import Settings
from serge.chats.lookup import Lookup
from serge.web.api.audit import router as audit_router
from serge.web.api.groups import router as groups_router
from serge.web.pages.groups import router as group_pages
from serge.web.api.me import router as me_router
from serge.web.pages.accounts import build_account_pages
from serge.web.pages.sign_in import router as sign_in_pages
from serge.web.pages.usage import build_usage_pages
from serge.web.pages.my_usage import router as my_usage_page
from serge.web.api.accounts import router as accounts_router
from serge.web.anthropic.api import router as anthropic_router
from serge.web.anthropic.errors import ANTHROPIC_ERRORS
from serge.web.ollama.errors import OLLAMA_ERRORS
from serge.web.http.auth import Authenticate, ProxiedClient, may_see_details
from serge.web.api.chats import router as chats_router
from serge.web.openai.completions import router as completions_router
from serge.web.pages.docs import install_docs
from serge.web.openai.embeddings import router as embeddings_router
from serge.web.http.errors import ApiError, install_error_handlers
from serge.web.http.guard import protect
from serge.web.api.knowledge import router as knowledge_router
from serge.web.api.models import router as models_router
from serge.web.api.tools import router as tools_router
from serge.web.pages.tools import router as tool_pages
from serge.web.api.usage import router as usage_router
from serge.web.api.my_usage import router as my_usage_router
from serge.web.api.presets import router as presets_router
from serge.web.ollama.api import router as ollama_router
from serge.web.openai.chat import router as openai_router
from serge.web.pages.chat import STATIC, build_pages
from serge.web.responses.api import router as responses_router
from serge.web.http.request_log import RequestLog
from serge.web.http.limits.user_limits import UserLimits
from serge.web.mcp import install_mcp
from serge.web.http.limits.usage_meter import UsageMeter

log = logging.getLogger(__name__)


def _warm_up(engine: Engine, app: FastAPI, url: str) -> None:
    try:
        engine.warm_up()
    except Exception as exc:  # shown by /api/health; requests get the error on their own
        log.error("Could not load the default model: %s", exc)
        app.state.load_error = str(exc)
    else:
        log.info("Ready at %s (%s)", url, engine.default_model)  # the first start's last stage


def build_app(settings: Settings, engine: Engine) -> FastAPI:
    """A ready app over `engine`; whoever made the engine closes it."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.engine = engine
        app.state.load_error = None
        services = app.state.services = Services.open(settings, engine, serving=True)
        log.info("%s", services.database.describe())
        await services.tools.start()
        if services.shared is not None:
            limits.share_streams(services.shared)
        loader = threading.Thread(target=_warm_up, args=(app.state.engine, app, f"http://{settings.host}:{settings.port}"),
                                  name="serge-warm-up", daemon=True)
        loader.start()
        try:
            # /mcp: what agents may look up, and the MCP SDK's task group for its requests
            async with mcp.running(Lookup(services.knowledge, services.documents, services.chats)):
                yield
        finally:
            services.chats.close()  # replies in progress are stopped and saved as incomplete
            await services.tools.close()  # the MCP servers Serge started stop with it
            services.close()
        loader.join()

    app = FastAPI(
        title="Serge",
        version=__version__,
        summary="A private chat for local language models, with an OpenAI-compatible API.",
        lifespan=lifespan,
        docs_url=None,  # served by install_docs from Serge's own files
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.draining = False
    limits = UserLimits(settings.user_max_streams, settings.user_requests_per_minute)
    # Innermost first: every request has a user (or is refused) before routes run, and only
    # after the Host, Origin and body checks (outer) have let it through.
    app.add_middleware(UsageMeter)  # inside Authenticate: a model request's quota, then its usage
    app.add_middleware(Authenticate, limits=limits)
    protect(app, settings)  # security headers, Host and Origin checks, body limits
    app.add_middleware(RequestLog)  # one line for every answer, refusals included
    app.add_middleware(ProxiedClient, trusted_proxies=settings.trusted_proxies)  # outermost: who the client is
    install_docs(app)
    install_error_handlers(app, (OLLAMA_ERRORS, ANTHROPIC_ERRORS))  # each dialect's own shape
    app.include_router(openai_router)
    app.include_router(anthropic_router)
    app.include_router(embeddings_router)
    app.include_router(completions_router)
    app.include_router(ollama_router)
    app.include_router(responses_router)
    app.include_router(chats_router)
    app.include_router(knowledge_router)
    app.include_router(models_router)
    app.include_router(presets_router)
    app.include_router(accounts_router)
    app.include_router(tools_router)
    app.include_router(tool_pages)
    app.include_router(my_usage_router)
    app.include_router(usage_router)
    app.include_router(build_pages())
    app.include_router(build_account_pages(limits))
    app.include_router(sign_in_pages)
    app.include_router(me_router)
    app.include_router(groups_router)
    app.include_router(group_pages)
    app.include_router(audit_router)
    app.include_router(build_usage_pages())
    app.include_router(my_usage_page)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    mcp = install_mcp(app)  # /mcp: the user's knowledge, for other agents

    @app.get("/api/health", tags=["system"],
             summary="Is the server ready; what is loaded, on what device, for admins and this machine")
    def health(request: Request):
        engine: Engine = request.app.state.engine
        status = engine.status()
        # draining: stopping soon (web/server.py), a balancer sends new requests elsewhere
        state = "draining" if request.app.state.draining else "ok" if status.ready else \
            "error" if request.app.state.load_error else "loading"
        up = state == "ok"
        if not may_see_details(request):  # load balancers poll this; paths and devices are not theirs to see
            return JSONResponse({"status": state, "version": __version__, "default_model": status.default_model},
                                status_code=200 if up else 503)
        body = {
            "status": state,
            "version": __version__,
            "device": status.device,
            "dtype": status.dtype,
            "default_model": status.default_model,
            "models_loaded": [dataclasses.asdict(m) for m in status.loaded],
            "max_loaded_models": status.max_loaded_models,
            "memory_budget_bytes": status.memory_budget_bytes,
            "resident_bytes": status.resident_bytes,
            "models_remote": sorted(status.remote),
            "models_loading": status.loading,
            "error": request.app.state.load_error,
            "models": {name: dataclasses.asdict(snap) for name, snap in status.models.items()},
        }
        return JSONResponse(body, status_code=200 if up else 503)

    @app.get("/metrics", tags=["system"], response_class=PlainTextResponse,
             summary="Prometheus metrics: requests, tokens, latencies, queue")
    def metrics(request: Request):
        if not may_see_details(request):
            raise ApiError(403, "metrics are for admins and for requests made on this machine", code="forbidden")
        return Response(request.app.state.engine.prometheus(), media_type=CONTENT_TYPE_LATEST)

    return app
