"""One request context: a route's router declares what it is (`RouteKind`), and every cross-dialect rule reads that
declaration, never a URL pattern. A model route a router adds under a path no rule has heard of is metered, capped
and counted as streaming by its declaration alone. A real server (the stand-in model) and a real SQLite file."""

from __future__ import annotations

import httpx
from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from conftest import ServerThread, held_port
from standin import NAME as MODEL, stand_in
from test_accounts_api import add_user, serge
from test_tool_turn import ledger

from serge.engine import ChatRequest, Message, SamplingParams
from serge.settings import Settings
from serge.store import Database, QuotaRecord
from serge.store.usage.ledger import UsageStore
from serge.web.app import build_app
from serge.web.http.context import RouteKind
from serge.web.http.dialects import start_chat
from serge.web.http.request_log import note_generation

settings, engine = stand_in("settings", "engine")


def with_new_route(own: Settings, engine):
    """Serge's app, and a model route at a path of its own, declared and nothing else."""
    app = build_app(own, engine)
    router = APIRouter()

    @router.post("/v1/say", dependencies=[RouteKind("openai", model=True, streaming=True).depends])
    async def say(request: Request):
        ask = ChatRequest([Message("user", "hello")], SamplingParams(max_new_tokens=4))
        stream = await run_in_threadpool(start_chat, request, MODEL, ask)
        note_generation(request, stream.model, stream)
        return {"text": await run_in_threadpool(stream.text)}

    app.include_router(router)
    return app


def test_a_new_model_route_is_metered_by_its_declaration_alone(settings, engine, tmp_path):
    own = settings.model_copy(update={"data_dir": tmp_path, "port": held_port()})
    with ServerThread(with_new_route(own, engine), own.port) as running:
        before = ledger(tmp_path)
        answer = httpx.post(f"{running.url}/v1/say", timeout=60)
        assert answer.status_code == 200, answer.text
    assert ledger(tmp_path) > before, "the route's tokens are in the usage ledger"


def test_a_new_model_route_is_capped_by_its_declaration_alone(settings, engine, tmp_path):
    add_user(tmp_path, "bob")
    key = serge(tmp_path, "keys", "create", "bob", "--name", "t").strip()
    database = Database(f"sqlite:///{tmp_path / 'serge.db'}")
    from serge.store import AccountStore

    user_id = next(u.id for u in AccountStore(database).users() if u.name == "bob")
    UsageStore(database).set_quota("user", user_id, QuotaRecord(requests_per_minute=1))
    database.close()
    own = settings.model_copy(update={"data_dir": tmp_path, "port": held_port()})
    with ServerThread(with_new_route(own, engine), own.port) as running:
        sent = [httpx.post(f"{running.url}/v1/say", timeout=60, headers={"Authorization": f"Bearer {key}"})
                for _ in range(2)]
    assert [r.status_code for r in sent] == [200, 429]
    assert "model requests a minute" in sent[1].json()["error"]["message"]
