"""A model or preset shared with a group, on a real server over two stand-in models: listed and answered for the
group's members, absent from every list and an unknown model in each dialect's own 404 for everyone else.

One check does it: the request's context hides what its user may not use (serge/access.py), and the engine's
name resolution and the presets' read it, so no route checks anything of its own.
"""

from __future__ import annotations

from contextlib import closing

import httpx
import pytest
from conftest import own_server

from serge.cli.main import main as serge_main
from serge.engine import Engine, SchedulerLimits
from test_chat_tools import script
from serge.engine.metrics import EngineMetrics

OPEN, SHARED = "standin", "team-model"
PASSWORDS = {"root": "root-password", "ada": "ada-password", "bo": "bo-password"}


@pytest.fixture(scope="module")
def settings(standin_settings):
    return standin_settings


@pytest.fixture(scope="module")
def engine(settings):
    from standin import standin_model

    metrics, limits = EngineMetrics(), SchedulerLimits.from_settings(settings)
    models = {name: standin_model(name, metrics=metrics, limits=limits) for name in (OPEN, SHARED)}
    served = Engine(settings, backends=models)
    served.metrics = metrics
    yield served
    served.close()
    for model in models.values():
        model.close()


def login(url: str, name: str) -> httpx.Client:
    client = httpx.Client(base_url=url, timeout=60)
    assert client.post("/login", data={"name": name, "password": PASSWORDS[name]}).status_code == 303
    return client


@pytest.fixture(scope="module")
def site(settings, engine, tmp_path_factory):
    folder = tmp_path_factory.mktemp("sharing")
    serge_main(["mcp", "add", "team-tools", "--data-dir", str(folder), "--", *script("t", "echo")])
    with own_server(settings, engine, folder) as url:
        with httpx.Client(base_url=url) as local:  # the first account, made on this machine, is an admin
            assert local.post("/api/users", json={"name": "root", "password": PASSWORDS["root"]}).status_code == 201
        with closing(login(url, "root")) as root:
            for name in ("ada", "bo"):
                assert root.post("/api/users", json={"name": name, "password": PASSWORDS[name]}).status_code == 201
            assert root.post("/api/groups", json={"name": "ml"}).status_code == 201
            assert root.put("/api/groups/ml/members/ada").status_code == 200
            assert root.post("/api/presets", json={"name": "team-helper", "model": OPEN, "shared": True,
                                                   "system_prompt": "Be brief."}).status_code == 201
            assert root.put(f"/api/groups/ml/shares/model/{SHARED}").status_code == 200
            assert root.put("/api/groups/ml/shares/preset/team-helper").status_code == 200
            assert root.put("/api/groups/ml/shares/tool_server/team-tools").status_code == 200
        with closing(login(url, "ada")) as ada, closing(login(url, "bo")) as bo:
            yield {"url": url, "ada": ada, "bo": bo}


ASKED = {
    "openai chat": ("/v1/chat/completions", lambda m: {"model": m, "max_tokens": 3,
                                                       "messages": [{"role": "user", "content": "hi"}]}),
    "openai completions": ("/v1/completions", lambda m: {"model": m, "prompt": "hi", "max_tokens": 3}),
    "responses": ("/v1/responses", lambda m: {"model": m, "input": "hi", "max_output_tokens": 16}),
    "anthropic": ("/v1/messages", lambda m: {"model": m, "max_tokens": 3,
                                             "messages": [{"role": "user", "content": "hi"}]}),
    "ollama chat": ("/api/chat", lambda m: {"model": m, "stream": False,
                                            "messages": [{"role": "user", "content": "hi"}],
                                            "options": {"num_predict": 3}}),
    "ollama generate": ("/api/generate", lambda m: {"model": m, "prompt": "hi", "stream": False,
                                                    "options": {"num_predict": 3}}),
}
CHATS = ("openai chat", "responses", "anthropic", "ollama chat")  # where a preset's name is a model's


def listed(client: httpx.Client) -> set[str]:
    """Every name the lists show: OpenAI's (and Anthropic's) /v1/models, Ollama's /api/tags, Serge's /api/models."""
    names = {m["id"] for m in client.get("/v1/models").json()["data"]}
    names |= {m["name"].removesuffix(":latest") for m in client.get("/api/tags").json()["models"]}
    names |= {m["name"] for m in client.get("/api/models").json()["data"]}
    return names


def test_the_groups_members_see_and_use_what_is_shared_with_it(site):
    ada = site["ada"]
    assert {OPEN, SHARED, "team-helper"} <= listed(ada)
    for dialect, (path, body) in ASKED.items():
        for name in (SHARED, "team-helper") if dialect in CHATS else (SHARED,):
            answer = ada.post(path, json=body(name))
            assert answer.status_code == 200, (dialect, name, answer.text)
    assert SHARED in ada.get("/", headers={"Accept": "text/html"}).text


@pytest.mark.parametrize("dialect", list(ASKED))
def test_everyone_else_gets_an_unknown_model_in_the_dialects_own_404(site, dialect):
    path, body = ASKED[dialect]
    for name in (SHARED, "team-helper") if dialect in CHATS else (SHARED,):
        answer = site["bo"].post(path, json=body(name))
        assert answer.status_code == 404, (name, answer.text)
        error = answer.json()
        if dialect == "anthropic":
            assert error["type"] == "error" and error["error"]["type"] == "not_found_error"
        elif dialect.startswith("ollama"):
            assert isinstance(error["error"], str)
        else:
            assert error["error"]["code"] == "model_not_found"
        others = answer.text.replace(f"'{name}'", "")  # the name asked for is echoed; nothing hidden is listed
        assert SHARED not in others and "team-helper" not in others
    assert site["bo"].post(path, json=body(OPEN)).status_code == 200


def test_what_is_not_shared_with_them_is_absent_from_every_list_and_the_page(site):
    bo = site["bo"]
    assert OPEN in listed(bo) and not {SHARED, "team-helper"} & listed(bo)
    page = bo.get("/", headers={"Accept": "text/html"}).text
    assert SHARED not in page and "team-helper" not in page
    assert bo.post("/api/show", json={"model": SHARED}).status_code == 404
    helper = next(p for p in site["ada"].get("/api/presets").json()["data"] if p["name"] == "team-helper")
    assert bo.get(f"/api/presets/{helper['id']}").status_code == 404
    assert site["ada"].get(f"/api/presets/{helper['id']}").status_code == 200


def test_only_admins_share_and_an_unshared_model_is_everyones_again(site):
    bo = site["bo"]
    assert bo.put(f"/api/groups/ml/shares/model/{OPEN}").status_code == 403
    assert bo.get("/api/shares").status_code == 403
    with closing(login(site["url"], "root")) as root:
        shares = root.get("/api/shares").json()["data"]
        assert {"kind": "model", "name": SHARED, "group": "ml"} in shares
        assert root.put(f"/api/groups/ml/shares/tool/{OPEN}").status_code == 400
        assert SHARED in listed(root), "admins see everything, to manage it"
        assert root.delete(f"/api/groups/ml/shares/model/{SHARED}").json()["shared"] is False
        try:
            assert SHARED in listed(bo)
            path, body = ASKED["openai chat"]
            assert bo.post(path, json=body(SHARED)).status_code == 200
        finally:
            assert root.put(f"/api/groups/ml/shares/model/{SHARED}").status_code == 200


def test_a_tool_server_shared_with_a_group_is_theirs_to_tick_and_unknown_to_everyone_else(site):
    ada, bo = site["ada"], site["bo"]
    assert "team-tools" in [s["name"] for s in ada.get("/api/tools").json()["servers"]]
    assert "team-tools" not in [s["name"] for s in bo.get("/api/tools").json()["servers"]]
    assert ada.post("/api/chats", json={"tools": ["team-tools"]}).status_code == 201
    refused = bo.post("/api/chats", json={"tools": ["team-tools"]})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "tool_server_not_found"
    assert "team-tools" not in refused.json()["error"]["message"].replace("'team-tools'", "")
    assert "team-tools" not in bo.get("/", headers={"Accept": "text/html"}).text
