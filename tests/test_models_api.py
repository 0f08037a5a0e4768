"""The model library over HTTP: list, show, pull (progress, events, cancel), delete; and only library names, ever."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from starlette.requests import Request

from serge.engine import Engine, ModelLibrary
from serge.engine.registry import resident_bytes
from serge.settings import Settings
from serge.web.app import build_app
from serge.web.http.errors import ApiError
from serge.web.api.models import require_admin

from conftest import GGUF_REPO, MODEL, TINY_REPO, ServerThread, models_dir, held_port

pytestmark = pytest.mark.real_model

REMOTE = "remote-default"


@pytest.fixture(scope="module")
def library_server(tmp_path_factory, fake_hub):
    """A server whose default model is remote (nothing to load), pulling from the fake hub into its own dir."""
    data = tmp_path_factory.mktemp("library")
    ModelLibrary(data / "models").import_path(ModelLibrary(models_dir()).find(MODEL).transformers_folder(),
                                              "local-a", log=lambda _: None)
    settings = Settings(data_dir=data, models_dir=data / "models", hf_endpoint=fake_hub.url, port=held_port(),
                        default_model=REMOTE, remote_models={REMOTE: {"url": "http://127.0.0.1:9/v1"}})
    with Engine(settings) as engine, ServerThread(build_app(settings, engine), settings.port) as running:
        yield running.url, engine


@pytest.fixture
def hub(fake_hub):
    fake_hub.reset()
    yield fake_hub
    fake_hub.reset()


def events(url: str) -> list[tuple[str, dict]]:
    """Every server-sent event of a pull until the stream ends."""
    found, kind = [], None
    with httpx.stream("GET", url, timeout=120) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                found.append((kind, json.loads(line[6:])))
    return found


def installed(engine: Engine) -> list[str]:
    """The models dir's folders, but the download cache."""
    return sorted(p.name for p in engine.settings.models_path.iterdir() if p.name != ".cache")


def names(base: str) -> list[str]:
    return [m["name"] for m in httpx.get(f"{base}/api/models").json()["data"]]


def test_a_pull_streams_its_progress_to_100_percent_and_the_model_is_listed_everywhere(library_server, hub):
    base, _ = library_server
    started = httpx.post(f"{base}/api/models/pulls", json={"source": TINY_REPO})
    assert started.status_code == 202, started.text
    pull = started.json()
    assert pull["state"] == "running" and pull["name"] == TINY_REPO.lower()
    seen = events(f"{base}/api/models/pulls/{pull['id']}/events")
    kinds = [k for k, _ in seen]
    assert kinds[-1] == "done" and set(kinds[:-1]) <= {"progress"}
    percents = [body["percent"] for _, body in seen if body["percent"] is not None]
    assert percents == sorted(percents) and percents[-1] == 100.0
    last = seen[-1][1]
    assert last["bytes_done"] == last["bytes_total"] == sum(p.stat().st_size for p in
                                                            hub.repos[TINY_REPO].files.values())
    assert httpx.get(f"{base}/api/models/pulls/{pull['id']}").json()["state"] == "done"

    name = pull["name"]
    assert names(base) == [REMOTE, "local-a", name], "the default first, then installed, then remote; each once"
    one = httpx.get(f"{base}/api/models/{name}").json()
    assert one["architecture"] == "LlamaForCausalLM" and one["chat_template"] and not one["loaded"]
    weights = hub.repos[TINY_REPO].files["model.safetensors"].stat().st_size
    assert one["engine"] == "transformers" and one["memory_bytes"] > one["size_bytes"] >= weights
    listed = [m["id"] for m in httpx.get(f"{base}/v1/models").json()["data"]]
    assert listed == [REMOTE, "local-a", name]
    assert httpx.get(f"{base}/v1/models/{name}").json() == {
        "id": name, "object": "model", "created": one["created"], "owned_by": "serge"}
    assert httpx.get(f"{base}/v1/models/{REMOTE}").json()["owned_by"] == "remote"

    assert httpx.delete(f"{base}/api/models/{name}").status_code == 204
    assert httpx.get(f"{base}/api/models/{name}").status_code == 404
    assert names(base) == [REMOTE, "local-a"]


def test_cancelling_a_pull_leaves_nothing_installed(library_server, hub):
    base, engine = library_server
    hub.faults.bytes_per_s = 20 * 2**20
    before = installed(engine)
    pull = httpx.post(f"{base}/api/models/pulls", json={"source": f"{GGUF_REPO}:Q8_0"}).json()
    deadline = time.monotonic() + 60
    while httpx.get(f"{base}/api/models/pulls/{pull['id']}").json()["bytes_done"] < 5 * 2**20:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    cancelled = httpx.delete(f"{base}/api/models/pulls/{pull['id']}", timeout=30).json()
    assert cancelled["state"] == "cancelled" and cancelled["percent"] < 100
    assert installed(engine) == before, "no model, no staging folder"
    assert not any((engine.settings.models_path / ".cache").rglob("models--*"))
    assert pull["name"] not in names(base)


@pytest.mark.parametrize("body", [
    {"source": "/etc/passwd"}, {"source": "../../models/x"}, {"source": "http://example.com/org/model"},
    {"source": "file:///etc/x"}, {"source": "org/name/extra"}, {"source": "org/name", "name": "../escape"},
    {"source": "org/name", "name": "/abs/path"}, {"source": "org/" + "x" * 300},
])
def test_a_pull_of_anything_but_a_hub_repo_is_refused(library_server, hub, body):
    base, _ = library_server
    reply = httpx.post(f"{base}/api/models/pulls", json=body)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["message"]
    assert hub.gets == [] and httpx.get(f"{base}/api/models/pulls").json()["data"][-1:] != [body]


def test_unknown_models_and_pulls_answer_404_in_openai_shape(library_server):
    base, _ = library_server
    for url in ["/v1/models/no-such-model", "/v1/models//etc/passwd", "/api/models/no-such", "/api/models/a/b/c"]:
        reply = httpx.get(base + url)
        assert reply.status_code == 404, url
        assert reply.json()["error"]["code"] == "model_not_found"
    for pull_id in ["0" * 32, "not-hex", "x" * 500]:
        reply = httpx.get(f"{base}/api/models/pulls/{pull_id}")
        assert reply.status_code == 404 and reply.json()["error"]["code"] == "pull_not_found"


def test_a_model_cannot_be_deleted_while_it_answers_nor_a_remote_one(library_server):
    base, engine = library_server
    reply = httpx.delete(f"{base}/api/models/{REMOTE}")
    assert reply.status_code == 409 and "remote" in reply.json()["error"]["message"]
    body = {"model": "local-a", "messages": [{"role": "user", "content": "Count to a thousand."}], "stream": True,
            "max_tokens": 400, "ignore_eos": True}
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=300) as answering:
        next(answering.iter_lines())  # it has started
        refused = httpx.delete(f"{base}/api/models/local-a")
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["code"] == "model_in_use"
        health = httpx.get(f"{base}/api/health").json()
        assert [(m["name"], m["busy"]) for m in health["models_loaded"]] == [("local-a", True)]
        assert health["models_loaded"][0]["memory_bytes"] > 100e6
    assert "local-a" in names(base)


def test_pulling_and_deleting_are_for_admins():
    from datetime import UTC, datetime

    from serge.accounts import LOCAL_USER
    from serge.store import UserRecord

    def request(user) -> Request:
        from serge.web.http.context import context_of

        scope = {"type": "http", "client": ("127.0.0.1", 5000), "headers": [], "method": "POST", "path": "/"}
        context_of(scope).user = user  # as Authenticate leaves it
        return Request(scope)

    require_admin(request(LOCAL_USER))  # no accounts yet: the local user
    require_admin(request(UserRecord(id="a", name="ada", admin=True, created_at=datetime.now(UTC))))
    for user in (UserRecord(id="b", name="bob", admin=False, created_at=datetime.now(UTC)), None):
        with pytest.raises(ApiError) as refused:
            require_admin(request(user))
        assert refused.value.status in (401, 403)


@pytest.mark.parametrize("spelling", ["{folder}", "{folder}/", "{parent}/./{name}/", "{parent}/{name}/./",
                                      "{folder}/model.safetensors", "../{name}", "{name}/", "HuggingFaceTB/x"])
def test_a_path_or_a_second_spelling_never_loads_a_model_and_memory_stays_flat(server, engine, spelling):
    """The issue's attack: a folder's path as the model, twice, loaded two more copies. Now: 404, nothing loads."""
    installed = ModelLibrary(engine.settings.models_path).find(MODEL)
    model = spelling.format(folder=installed.folder, parent=installed.folder.parent, name=installed.folder.name)
    warm = httpx.post(f"{server}/v1/chat/completions", timeout=120, json={  # the model's worker is set up
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})
    assert warm.status_code == 200
    loaded_before, rss_before = sorted(engine.status().loaded, key=str), resident_bytes()
    for _ in range(2):
        reply = httpx.post(f"{server}/v1/chat/completions", timeout=60, json={
            "model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        assert reply.status_code == 404, reply.text
        assert reply.json()["error"]["code"] == "model_not_found"
    chat = httpx.post(f"{server}/api/chats", json={}).json()
    assert httpx.patch(f"{server}/api/chats/{chat['id']}", json={"model": model}).status_code == 404
    imported = httpx.post(f"{server}/api/chats/import", json={"chat": {"title": "x", "model": model}, "messages": []})
    assert imported.status_code in (400, 404)
    assert sorted(engine.status().loaded, key=str) == loaded_before
    assert resident_bytes() - rss_before < 50 * 2**20


def test_the_api_docs_describe_the_library_endpoints(library_server):
    base, _ = library_server
    paths = httpx.get(f"{base}/openapi.json", timeout=60).json()["paths"]
    for path, method in [("/api/models", "get"), ("/api/models/{name}", "get"), ("/api/models/{name}", "delete"),
                         ("/api/models/pulls", "post"), ("/api/models/pulls/{pull_id}", "get"),
                         ("/api/models/pulls/{pull_id}/events", "get"), ("/api/models/pulls/{pull_id}", "delete"),
                         ("/v1/models/{model_id}", "get")]:
        assert paths[path][method]["summary"], (path, method)
    assert "source" in httpx.get(f"{base}/openapi.json", timeout=60).json()["components"]["schemas"]["PullIn"]["properties"]
