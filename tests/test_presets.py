"""Presets through every door, on a real server over the recording stand-in model (it keeps what it was asked):
made with /api/presets, named as a model by the `openai` and `ollama` clients, Anthropic's and the chat API;
listed in each model list; the request's own fields over the preset's; one user's preset unseen and unusable
by another; a preset whose base model is removed says so."""

from __future__ import annotations

from contextlib import closing

import anthropic
import httpx
import ollama
import openai
import pytest

from conftest import own_server
from standin import NAME
from test_accounts_api import add_user, login, serge
from test_chat_documents import EMBEDDER, QUESTION, documents_engine, recorder  # noqa: F401
from test_chats_api import send, wait_for

import documents as files
from serge.engine import ChatRequest, Message

PROMPT = "You are Harbourbot. Answer in the voice of a ferry captain."


@pytest.fixture(scope="module")
def engine(standin_settings, recorder, tmp_path_factory):
    """(settings, engine): the recording stand-in, the hash embedder, and a models dir of this module's own
    (a test installs and removes a model there)."""
    own = standin_settings.model_copy(update={"models_dir": tmp_path_factory.mktemp("presets-models")})
    with documents_engine(own, recorder) as running:
        yield running


@pytest.fixture(scope="module")
def site(engine, tmp_path_factory):
    """A server with alice (admin) and bob, each with an API key."""
    settings, running = engine
    data_dir = tmp_path_factory.mktemp("presets-data")
    with own_server(settings, running, data_dir) as url:
        add_user(data_dir, "alice", "--admin")
        add_user(data_dir, "bob")
        keys = {name: serge(data_dir, "keys", "create", name).strip() for name in ("alice", "bob")}
        yield {"url": url, "data_dir": data_dir, "keys": keys}


@pytest.fixture(scope="module")
def alice(site):
    with closing(login(site["url"], "alice")) as client:
        yield client


@pytest.fixture(scope="module")
def bob(site):
    with closing(login(site["url"], "bob")) as client:
        yield client


def openai_client(site, who: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=site["url"] + "/v1", api_key=site["keys"][who], max_retries=0)


def ollama_client(site, who: str) -> ollama.Client:
    return ollama.Client(host=site["url"], headers={"Authorization": f"Bearer {site['keys'][who]}"})


def make(client: httpx.Client, **body) -> dict:
    made = client.post("/api/presets", json=body)
    assert made.status_code == 201, made.text
    return made.json()


def asked(recorder) -> list[tuple[str, str]]:
    """The last conversation the model was asked to answer, as (role, text)."""
    return [(m.role, m.content) for m in recorder.asked[-1]]


@pytest.fixture(scope="module")
def harbour(alice):
    """alice's preset for everyone: the stand-in, a system prompt, greedy, 6 tokens at most."""
    return make(alice, name="harbourbot", model=NAME, system_prompt=PROMPT, shared=True,
                settings={"temperature": 0, "max_new_tokens": 6})


def test_a_preset_named_by_the_openai_client_gets_its_prompt_and_settings(site, harbour, recorder):
    client = openai_client(site, "bob")
    reply = client.chat.completions.create(model="harbourbot", messages=[{"role": "user", "content": "Hello"}])
    assert asked(recorder) == [("system", PROMPT), ("user", "Hello")]
    assert reply.model == "harbourbot" and reply.usage.completion_tokens == 6  # the preset's max_new_tokens
    # the same as asking the base model with the preset's prompt and settings by hand
    by_hand = client.chat.completions.create(
        model=NAME, temperature=0, max_tokens=6,
        messages=[{"role": "system", "content": PROMPT}, {"role": "user", "content": "Hello"}])
    assert by_hand.choices[0].message.content == reply.choices[0].message.content
    assert by_hand.usage.prompt_tokens == reply.usage.prompt_tokens


def test_the_requests_own_system_prompt_and_settings_win_over_the_presets(site, harbour, recorder):
    client = openai_client(site, "bob")
    reply = client.chat.completions.create(
        model="harbourbot", max_tokens=3,
        messages=[{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hello"}])
    assert asked(recorder) == [("system", "Be terse."), ("user", "Hello")]  # the preset's prompt is replaced
    assert reply.usage.completion_tokens == 3  # max_tokens over the preset's 6
    # a field the request leaves out keeps the preset's: greedy, so two replies are the same
    again = client.chat.completions.create(
        model="harbourbot", max_tokens=3,
        messages=[{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hello"}])
    assert again.choices[0].message.content == reply.choices[0].message.content


def test_a_preset_named_by_the_ollama_client_answers_under_its_name(site, harbour, recorder):
    client = ollama_client(site, "bob")
    reply = client.chat(model="harbourbot", messages=[{"role": "user", "content": "Hello"}], stream=False)
    assert asked(recorder) == [("system", PROMPT), ("user", "Hello")]
    assert reply.model == "harbourbot:latest" and reply.eval_count == 6
    streamed = list(client.chat(model="harbourbot:latest", messages=[{"role": "user", "content": "Hello"}],
                                stream=True, options={"num_predict": 2}))
    assert streamed[-1].done and streamed[-1].eval_count == 2  # the request's num_predict wins
    generated = client.generate(model="harbourbot", prompt="Hello")
    assert asked(recorder) == [("system", PROMPT), ("user", "Hello")] and generated.eval_count == 6


def test_a_preset_named_in_anthropics_messages_gets_its_prompt(site, harbour, recorder):
    client = anthropic.Anthropic(base_url=site["url"], api_key=site["keys"]["bob"], max_retries=0)
    reply = client.messages.create(model="harbourbot", max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    assert asked(recorder) == [("system", PROMPT), ("user", "Hi")]
    assert reply.model == "harbourbot" and reply.usage.output_tokens == 4


def test_presets_are_listed_after_the_chat_models_in_every_model_list(site, harbour, alice):
    own = make(alice, name="alices-notes", model=NAME)
    openai_ids = [m.id for m in openai_client(site, "alice").models.list()]
    after = openai_ids.index(NAME) + 1  # the one chat model: the presets follow it, before what comes after it
    assert openai_ids[after:after + 2] == ["alices-notes", "harbourbot"] and openai_ids.count("harbourbot") == 1
    entry = alice.get("/v1/models").json()["data"][openai_ids.index("harbourbot")]
    assert entry["owned_by"] == "preset" and entry["preset"] == {"model": NAME, "state": "ready", "shared": True}
    assert alice.get("/v1/models/harbourbot").json()["id"] == "harbourbot"

    tags = [m.model for m in ollama_client(site, "alice").list().models]
    assert "harbourbot:latest" in tags and "alices-notes:latest" in tags
    listed = next(m for m in alice.get("/api/tags").json()["models"] if m["name"] == "harbourbot:latest")
    assert listed["details"]["parent_model"] == f"{NAME}:latest"

    claude = anthropic.Anthropic(base_url=site["url"], api_key=site["keys"]["alice"], max_retries=0)
    anthropic_ids = [m.id for m in claude.models.list()]
    assert anthropic_ids == openai_ids
    assert alice.delete(f"/api/presets/{own['id']}").status_code == 204


def test_bob_can_neither_see_nor_use_nor_change_alices_own_preset(site, alice, bob, harbour):
    secret = make(alice, name="alices-secret", model=NAME, system_prompt="Only for alice.")
    assert "alices-secret" not in [p["name"] for p in bob.get("/api/presets").json()["data"]]
    assert "alices-secret" not in [m.id for m in openai_client(site, "bob").models.list()]
    assert "alices-secret:latest" not in [m.model for m in ollama_client(site, "bob").list().models]
    for method, path in (("GET", f"/api/presets/{secret['id']}"), ("PATCH", f"/api/presets/{secret['id']}"),
                         ("DELETE", f"/api/presets/{secret['id']}")):
        answer = bob.request(method, path, json={"name": "mine-now"} if method == "PATCH" else None)
        assert answer.status_code == 404, (method, answer.text)
    with pytest.raises(openai.NotFoundError):
        openai_client(site, "bob").chat.completions.create(model="alices-secret",
                                                           messages=[{"role": "user", "content": "Hi"}])
    with pytest.raises(ollama.ResponseError) as refused:
        ollama_client(site, "bob").chat(model="alices-secret", messages=[{"role": "user", "content": "Hi"}])
    assert refused.value.status_code == 404
    chat = bob.post("/api/chats", json={"model": "alices-secret"})
    assert chat.status_code == 404, chat.text
    # and the preset for everyone is bob's to use, not to change
    assert bob.patch(f"/api/presets/{harbour['id']}", json={"system_prompt": "Mine"}).status_code == 403
    assert bob.delete(f"/api/presets/{harbour['id']}").status_code == 403
    assert bob.post("/api/presets", json={"name": "for-all", "model": NAME, "shared": True}).status_code == 403
    mine = make(bob, name="bobs-own", model=NAME)
    assert mine["shared"] is False and bob.delete(f"/api/presets/{mine['id']}").status_code == 204


def test_a_presets_name_may_not_be_a_models_nor_taken(alice, harbour):
    taken = alice.post("/api/presets", json={"name": NAME, "model": NAME})
    assert taken.status_code == 400 and "installed model" in taken.json()["error"]["message"]
    again = alice.post("/api/presets", json={"name": "harbourbot", "model": NAME})
    assert again.status_code == 409 and again.json()["error"]["code"] == "preset_exists"
    for body, field in (({"name": "two words", "model": NAME}, "name"), ({"name": "x", "model": "no-such"}, "model"),
                        ({"name": "x", "model": EMBEDDER}, "model"),
                        ({"name": "x", "model": NAME, "settings": {"temperature": 9}}, "settings.temperature"),
                        ({"name": "x", "model": NAME, "tools": ["../etc"]}, "tools"),
                        ({"name": "x", "model": NAME, "knowledge": ["nothing-here"]}, "knowledge")):
        refused = alice.post("/api/presets", json=body)
        assert 400 <= refused.status_code < 500 and refused.json()["error"]["param"] == field, refused.text


def test_a_chat_on_a_preset_uses_its_prompt_under_the_chats_own(alice, harbour, recorder):
    chat = alice.post("/api/chats", json={"model": "harbourbot"}).json()
    assert chat["model"] == "harbourbot"
    _, reply = send(alice, f"/api/chats/{chat['id']}/messages", {"content": "Hello"})
    assert asked(recorder) == [("system", PROMPT), ("user", "Hello")]
    assert reply["model"] == NAME and reply["completion_tokens"] == 6 and reply["settings"]["temperature"] == 0
    alice.patch(f"/api/chats/{chat['id']}", json={"system_prompt": "The chat's own.",
                                                   "settings": {"max_new_tokens": 2}})
    _, reply = send(alice, f"/api/chats/{chat['id']}/messages", {"content": "Again"})
    assert asked(recorder)[0] == ("system", "The chat's own.") and reply["completion_tokens"] == 2


def test_a_presets_knowledge_is_searched_for_whoever_uses_it(site, alice, bob, recorder):
    harbour = alice.post("/api/knowledge", json={"name": "minutes"}).json()
    put = alice.post(f"/api/knowledge/{harbour['id']}/files",
                     files={"file": ("minutes.pdf", files.long_report_pdf(), "application/pdf")})
    assert put.status_code == 201, put.text
    wait_for(lambda: alice.get(f"/api/knowledge/{harbour['id']}").json()["state"] == "ready", what="indexing")
    make(alice, name="harbour-archive", model=NAME, knowledge=["minutes"], shared=True,
         settings={"max_new_tokens": 2})
    openai_client(site, "bob").chat.completions.create(model="harbour-archive",
                                                       messages=[{"role": "user", "content": QUESTION}])
    assert files.PAGE_THREE_FACT in " ".join(asked(recorder)[-1][1].split())
    # bob's own chats on it get the passages too, named in the reply's sources
    chat = bob.post("/api/chats", json={"model": "harbour-archive"}).json()
    _, reply = send(bob, f"/api/chats/{chat['id']}/messages", {"content": QUESTION})
    assert reply["sources"] and reply["sources"][0]["collection"] == "minutes"
    # but alice's collection stays hers: bob cannot name it himself
    assert bob.post("/api/presets", json={"name": "bobs", "model": NAME, "knowledge": ["minutes"]}).status_code == 404


@pytest.mark.real_model  # tiny_checkpoint takes the bundled model's tokenizer
def test_a_preset_whose_base_model_is_removed_says_so(site, engine, alice, tiny_checkpoint):
    _, running = engine
    running.import_model(tiny_checkpoint, "tiny-base", log=lambda _: None)
    preset = make(alice, name="tiny-helper", model="tiny-base", shared=True)
    assert preset["state"] == "ready"
    running.remove("tiny-base")
    listed = {p["name"]: p for p in alice.get("/api/presets").json()["data"]}
    assert listed["tiny-helper"]["state"] == "model_missing"
    entry = next(m for m in alice.get("/v1/models").json()["data"] if m["id"] == "tiny-helper")
    assert entry["preset"]["state"] == "model_missing"
    assert "tiny-helper:latest" not in [m["name"] for m in alice.get("/api/tags").json()["models"]]
    with pytest.raises(openai.NotFoundError) as refused:
        openai_client(site, "alice").chat.completions.create(model="tiny-helper",
                                                             messages=[{"role": "user", "content": "Hi"}])
    assert "'tiny-base', which is no longer installed" in refused.value.message
    answer = alice.post("/api/chat", json={"model": "tiny-helper", "messages": [{"role": "user", "content": "Hi"}]})
    assert answer.status_code == 404 and "no longer installed" in answer.json()["error"]
    # pointed at an installed model, it works again
    assert alice.patch(f"/api/presets/{preset['id']}", json={"model": NAME}).json()["state"] == "ready"


def test_a_chat_exported_carries_its_preset_and_an_import_makes_it_the_importers_own(alice, bob, recorder):
    own = make(alice, name="alices-voice", model=NAME, system_prompt="Speak like alice.",
               settings={"max_new_tokens": 2}, tools=["wiki"])
    chat = alice.post("/api/chats", json={"model": "alices-voice"}).json()
    send(alice, f"/api/chats/{chat['id']}/messages", {"content": "Hello"})
    exported = alice.get(f"/api/chats/{chat['id']}/export", params={"format": "json"}).json()
    assert exported["chat"]["preset"] == {"name": "alices-voice", "model": NAME, "system_prompt": "Speak like alice.",
                                          "settings": {"max_new_tokens": 2}, "knowledge": [], "tools": ["wiki"],
                                          "tool_choice": "auto"}
    assert "alices-voice" not in [p["name"] for p in bob.get("/api/presets").json()["data"]]
    imported = bob.post("/api/chats/import", json=exported)
    assert imported.status_code == 201, imported.text
    assert imported.json()["model"] == "alices-voice"
    adopted = next(p for p in bob.get("/api/presets").json()["data"] if p["name"] == "alices-voice")
    assert adopted["shared"] is False and adopted["system_prompt"] == "Speak like alice." and adopted["id"] != own["id"]
    send(bob, f"/api/chats/{imported.json()['id']}/messages", {"content": "Hi"})
    assert asked(recorder)[0] == ("system", "Speak like alice.")
    # a second import finds it already there: no second preset
    assert bob.post("/api/chats/import", json=exported).status_code == 201
    assert [p["name"] for p in bob.get("/api/presets").json()["data"]].count("alices-voice") == 1


def test_presets_come_between_the_chat_models_and_the_embedding_models_one_per_name(engine, tmp_path):
    from dataclasses import replace

    from serge.chats import Presets
    from serge.store import Database, PresetStore

    _, running = engine
    database = Database(f"sqlite:///{tmp_path / 'serge.db'}")
    database.migrate()
    presets = Presets(PresetStore(database), running)
    presets.create("bob", False, name="writer", model=NAME)  # bob's own, before everyone's of that name
    presets.create("alice", True, name="writer", model=NAME, shared=True)
    presets.create("alice", True, name="editor", model=NAME, shared=True)
    chat = running.info(NAME)
    models = [chat, replace(chat, name="second-chat"), replace(chat, name="embedder", kind="embedding")]
    listed = presets.among("bob", models)
    assert [getattr(m, "name", None) or m.preset.name for m in listed] == [
        NAME, "second-chat", "editor", "writer", "embedder"]
    assert listed[3].preset.owner == "bob"  # his own over everyone's of that name
    assert presets.apply("bob", "writer", ChatRequest([Message("user", "Hi")])).preset.owner == "bob"
    assert presets.apply("carol", "writer", ChatRequest([Message("user", "Hi")])).preset.owner is None
    database.close()


def test_ollama_shows_a_preset_as_a_modelfile_from_its_base(site, harbour):
    shown = ollama_client(site, "bob").show("harbourbot")
    assert shown.modelfile.startswith(f"FROM {NAME}:latest\nSYSTEM \"\"\"{PROMPT}\"\"\"\n")
    assert "PARAMETER temperature" in shown.modelfile and shown.details.parent_model == f"{NAME}:latest"
