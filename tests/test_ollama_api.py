"""Ollama's API as Ollama's own clients use it: the official `ollama` client against a real server.

Listing, showing and loaded models; chat and generate, whole and streamed, with
Ollama's last record; options, JSON output, tool calls; both spellings of a name;
errors in Ollama's shape; and the same rules as every route (admins only for the
library, the Host and cross-site checks, a client that leaves stops its reply).
The shapes are checked on the stand-in model (standin.py); what needs an installed
model's files (the library's listing and facts, loading and unloading, pulls,
embeddings) or its language (a tool call learned from an earlier turn), and a whole
chat on each local engine, run on the real model (`real_model`).
"""

from __future__ import annotations

import itertools
import json
import time
from contextlib import closing

import httpx
import ollama
import pytest
from conftest import GGUF_REPO, MODEL as REAL, SMALL_WINDOW, ServerThread, held_port, models_dir, own_server, \
    server_of_its_own
from standin import NAME as MODEL, stand_in
from test_accounts_api import add_user, login, serge

from serge.engine import Engine, ModelLibrary
from serge.settings import Settings
from serge.web.app import build_app

settings, engine = stand_in("settings", "engine")
server = server_of_its_own()

LATEST, REAL_LATEST = f"{MODEL}:latest", f"{REAL}:latest"
HELLO = [{"role": "user", "content": "What is the capital of France?"}]
QUICK = {"temperature": 0, "num_predict": 8}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                   "required": ["city"]}}}
# One earlier turn in Ollama's own shapes (a call with arguments as an object, the tool's answer by tool_name):
# a 135M model offered tools in `auto` imitates it, so the reply calls the tool.
SHOWN_A_CALL = [
    {"role": "user", "content": "What is the weather in London?"},
    {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather",
                                                                      "arguments": {"city": "London"}}}]},
    {"role": "tool", "tool_name": "get_weather", "content": "rain"},
    {"role": "assistant", "content": "It is raining in London."},
    {"role": "user", "content": "What is the weather in Paris?"},
]
FINAL_FIELDS = ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count",
                "eval_duration")


@pytest.fixture(scope="module")
def client(server) -> ollama.Client:
    return ollama.Client(host=server, timeout=300)


@pytest.fixture(scope="module")
def real_url(real_settings, engines, tmp_path_factory) -> str:
    """A server over the real model, on the default engine."""
    with own_server(real_settings, engines("auto"), tmp_path_factory.mktemp("ollama-real")) as url:
        yield url


@pytest.fixture(scope="module")
def real_client(real_url) -> ollama.Client:
    return ollama.Client(host=real_url, timeout=300)


def post(server: str, path: str, body: dict, **kwargs) -> httpx.Response:
    return httpx.post(f"{server}{path}", json=body, timeout=300, **kwargs)


def assert_sane_final(last, prompt_at_least: int = 1) -> None:
    """Ollama's last record: done, a reason, counts and durations in nanoseconds that add up."""
    assert last.done is True and last.done_reason in ("stop", "length")
    for field in FINAL_FIELDS:
        assert isinstance(getattr(last, field), int), field
    assert last.prompt_eval_count >= prompt_at_least and last.eval_count >= 1
    assert last.eval_duration > 0 and last.prompt_eval_duration > 0
    assert last.total_duration >= last.prompt_eval_duration + last.eval_duration
    assert last.total_duration < 300 * 10**9, "durations are nanoseconds, not something larger"


# --- the library -----------------------------------------------------------------------------
@pytest.mark.real_model
def test_list_names_each_model_as_name_colon_tag_with_ollamas_details(real_client):
    client = real_client
    listed = {m.model: m for m in client.list().models}
    assert REAL_LATEST in listed, listed.keys()
    m = listed[REAL_LATEST]
    assert m.size > 10**7 and len(m.digest) == 64
    assert m.details.family == "llama" and m.details.parameter_size == "135M"
    assert m.details.format in ("gguf", "safetensors") and m.details.quantization_level
    assert m.modified_at.year >= 2024
    assert client.list().models[0].digest == client.list().models[0].digest, "the digest is stable"


@pytest.mark.real_model
def test_show_answers_for_both_spellings_of_a_name(real_client):
    client = real_client
    bare, tagged = client.show(REAL), client.show(REAL_LATEST)
    assert bare.details == tagged.details and bare.details.family == "llama"
    assert bare.modelinfo["general.parameter_count"] > 10**8
    assert bare.modelinfo["llama.context_length"] >= 2048
    assert "completion" in bare.capabilities and "tools" in bare.capabilities
    assert "temperature" in bare.parameters


@pytest.mark.real_model
def test_ps_lists_the_loaded_model_and_version_answers(real_client, real_url):
    client, server = real_client, real_url
    client.chat(model=REAL, messages=HELLO, options=QUICK)
    running = {m.model: m for m in client.ps().models}
    assert REAL_LATEST in running and running[REAL_LATEST].size > 0 and running[REAL_LATEST].context_length > 0
    assert httpx.get(f"{server}/api/version").json()["version"].count(".") == 2


# --- chat ----------------------------------------------------------------------------------------
def test_chat_whole_has_the_reply_and_ollamas_last_record(client):
    reply = client.chat(model=MODEL, messages=HELLO, options={"temperature": 0, "num_predict": 30})
    assert reply.message.role == "assistant" and reply.message.content.strip()
    assert reply.model == LATEST
    assert_sane_final(reply, prompt_at_least=5)


def test_chat_streamed_is_pieces_then_the_last_record_and_matches_the_whole_reply(client, server):
    whole = client.chat(model=MODEL, messages=HELLO, options={"temperature": 0, "num_predict": 30})
    parts = list(client.chat(model=MODEL, messages=HELLO, options={"temperature": 0, "num_predict": 30},
                             stream=True))
    assert len(parts) > 3 and all(not p.done for p in parts[:-1])
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert_sane_final(parts[-1], prompt_at_least=5)
    assert parts[-1].eval_count == whole.eval_count
    with httpx.stream("POST", f"{server}/api/chat", json={"model": MODEL, "messages": HELLO, "options": QUICK},
                      timeout=300) as raw:  # stream defaults to true, as in Ollama
        assert raw.headers["content-type"].startswith("application/x-ndjson")
        records = [json.loads(line) for line in raw.iter_lines() if line]
    assert records[-1]["done"] is True and records[-1]["truncated"] is False and len(records) > 2


def test_options_num_predict_caps_the_reply_and_a_seed_repeats_it(client):
    capped = client.chat(model=MODEL, messages=HELLO, options={"num_predict": 3, "temperature": 0})
    assert capped.eval_count == 3 and capped.done_reason == "length"
    story = [{"role": "user", "content": "Tell me a story about a dragon."}]
    runs = [client.chat(model=MODEL, messages=story, options={"seed": 7, "temperature": 1.0, "num_predict": 24})
            .message.content for _ in range(2)]
    other = client.chat(model=MODEL, messages=story, options={"seed": 8, "temperature": 1.0, "num_predict": 24})
    assert runs[0] == runs[1] and runs[0] != other.message.content


def test_options_ollama_has_and_serge_does_not_use_are_accepted(client):
    reply = client.chat(model=MODEL, messages=HELLO, options={**QUICK, "mirostat": 0, "num_thread": 2,
                                                              "num_gpu": 1, "no_such_option": True})
    assert reply.done


def test_num_ctx_caps_prompt_and_reply_together(client):
    prompt = client.chat(model=MODEL, messages=HELLO, options={"temperature": 0, "num_predict": 1})
    capped = client.chat(model=MODEL, messages=HELLO,
                         options={"temperature": 0, "num_ctx": prompt.prompt_eval_count + 4})
    assert capped.eval_count <= 4 and capped.done_reason == "length"


def test_format_json_and_a_schema_give_valid_json(client):
    ask = [{"role": "user", "content": "Give a JSON object with the name and age of a person."}]
    loose = client.chat(model=MODEL, messages=ask, format="json", options={"temperature": 0, "num_predict": 80})
    assert isinstance(json.loads(loose.message.content), dict)
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                               "population": {"type": "integer"}},
              "required": ["city", "population"]}
    shaped = client.generate(model=MODEL, prompt="Paris as JSON.", format=schema,
                             options={"temperature": 0, "num_predict": 80})
    value = json.loads(shaped.response)
    assert set(value) == {"city", "population"} and isinstance(value["population"], int)


@pytest.mark.real_model
def test_a_tool_call_comes_back_with_its_arguments_as_an_object(real_client):
    client = real_client
    reply = client.chat(model=REAL, messages=SHOWN_A_CALL, tools=[WEATHER], options={"temperature": 0,
                                                                                      "num_predict": 40})
    assert reply.message.tool_calls, reply.message.content
    call = reply.message.tool_calls[0]
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
    streamed = list(client.chat(model=REAL, messages=SHOWN_A_CALL, tools=[WEATHER], stream=True,
                                options={"temperature": 0, "num_predict": 40}))
    calls = [c for p in streamed for c in (p.message.tool_calls or ())]
    assert [c.function.arguments for c in calls] == [{"city": "Paris"}] and streamed[-1].done


def test_an_empty_chat_loads_the_model(client):
    loaded = client.chat(model=LATEST, messages=[])
    assert loaded.done and loaded.done_reason == "load"


# --- generate ------------------------------------------------------------------------------------
def test_generate_whole_streamed_and_raw(client):
    whole = client.generate(model=MODEL, prompt="What is the capital of France?", system="Answer in one word.",
                            options={"temperature": 0, "num_predict": 10})
    assert whole.response and whole.done
    assert_sane_final(whole, prompt_at_least=5)
    parts = list(client.generate(model=LATEST, prompt="What is the capital of France?", system="Answer in one word.",
                                 options={"temperature": 0, "num_predict": 10}, stream=True))
    assert "".join(p.response for p in parts) == whole.response and parts[-1].done
    raw = client.generate(model=MODEL, prompt="Once upon a time", raw=True, context=[1, 2, 3],
                          options={"temperature": 0, "num_predict": 6})
    assert raw.eval_count == 6 and raw.prompt_eval_count <= len("Once upon a time"), \
        "no chat template around a raw prompt"


def test_a_suffix_on_a_model_without_fim_tokens_is_a_400_in_ollamas_shape(client):
    with pytest.raises(ollama.ResponseError) as refused:
        client.generate(model=MODEL, prompt="def add(a, b):\n", suffix="    return c\n")
    assert refused.value.status_code == 400 and "fill-in-the-middle" in refused.value.error


# --- errors ------------------------------------------------------------------------------------
def test_errors_come_in_ollamas_shape(client, server):
    with pytest.raises(ollama.ResponseError) as missing:
        client.chat(model="no-such-model:7b", messages=HELLO)
    assert missing.value.status_code == 404 and "no-such-model:7b" in missing.value.error
    for path, body in [("/api/chat", {"model": MODEL, "messages": "hi"}),
                       ("/api/generate", {"model": MODEL, "prompt": "hi", "options": {"temperature": "hot"}}),
                       ("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "x",
                                                                   "images": ["aGk="]}]}),
                       ("/api/generate", {"model": MODEL, "prompt": "x", "template": "{{ .Prompt }}"}),
                       ("/api/show", {})]:
        answer = post(server, path, body)
        assert answer.status_code == 400 and set(answer.json()) == {"error"}, (path, answer.text)
    assert "temperature" in post(server, "/api/generate", {"model": MODEL, "prompt": "hi",
                                                           "options": {"temperature": "hot"}}).json()["error"]
    assert "images" in post(server, "/api/chat", {"model": MODEL, "messages": [
        {"role": "user", "content": "x", "images": ["aGk="]}]}).json()["error"]
    copy = post(server, "/api/copy", {"source": MODEL, "destination": "mine"})
    assert copy.status_code == 404 and "/api/tags" in copy.json()["error"]
    assert "message" in httpx.get(f"{server}/api/chats/nope").json()["error"], "Serge's own API keeps its shape"


def test_the_api_docs_list_the_ollama_routes(server):
    paths = httpx.get(f"{server}/openapi.json", timeout=60).json()["paths"]
    assert {"/api/chat", "/api/generate", "/api/tags", "/api/show", "/api/ps", "/api/version", "/api/pull",
            "/api/delete", "/api/chats"} <= set(paths)


# --- the same rules as every route ---------------------------------------------------------------
def test_a_hostile_host_and_a_cross_site_post_are_refused(server, engine):
    before = engine.metrics.snapshot()[MODEL].requests
    body = {"model": MODEL, "messages": HELLO, "options": QUICK}
    rebound = post(server, "/api/chat", body, headers={"Host": "evil.example"})
    assert rebound.status_code == 421 and "evil.example" in rebound.json()["error"]
    for path, payload in [("/api/chat", body), ("/api/generate", {"model": MODEL, "prompt": "hi"}),
                          ("/api/pull", {"model": MODEL})]:
        crossed = post(server, path, payload, headers={"Origin": "http://evil.example"})
        assert crossed.status_code == 403 and set(crossed.json()) == {"error"}, path
    sneaky = post(server, "/api/chat", body, headers={"Sec-Fetch-Site": "cross-site"})
    assert sneaky.status_code == 403
    form = httpx.post(f"{server}/api/generate", content=json.dumps({"model": MODEL, "prompt": "hi"}),
                      headers={"Content-Type": "text/plain"})
    assert form.status_code == 415
    assert engine.metrics.snapshot()[MODEL].requests == before, "nothing was generated"


def _cancelled(engine) -> float:
    return engine.metrics.registry.get_sample_value(
        "serge_requests_total", {"model": MODEL, "reason": "cancelled"}) or 0.0


def test_a_client_that_leaves_mid_stream_stops_its_generation(server, engine):
    before = _cancelled(engine)
    essay = {"model": MODEL, "messages": [{"role": "user", "content": "Write a very long essay about Rome."}],
             "options": {"temperature": 0, "num_predict": 500}}
    with httpx.stream("POST", f"{server}/api/chat", json=essay, timeout=60) as reply:
        for i, _ in enumerate(reply.iter_lines()):
            if i >= 4:
                break
    deadline = time.monotonic() + 20
    while _cancelled(engine) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _cancelled(engine) == before + 1, "the abandoned generation was not cancelled"
    assert httpx.get(f"{server}/api/health").json()["models"][MODEL]["running"] == 0


@pytest.fixture(scope="module")
def accounts_site(settings, engine, tmp_path_factory):
    """A server with accounts: alice is an admin, bob is not."""
    own = Settings(data_dir=tmp_path_factory.mktemp("ollama-accounts"), models_dir=settings.models_dir,
                   torch_threads=settings.torch_threads)
    with ServerThread(build_app(own, engine), held_port()) as running:
        add_user(own.data_dir, "alice")
        add_user(own.data_dir, "bob")
        yield running.url, own.data_dir


def test_with_accounts_no_key_no_answer_and_only_admins_pull_or_delete(accounts_site):
    url, data_dir = accounts_site
    anonymous = ollama.Client(host=url)
    with pytest.raises(ollama.ResponseError) as refused:
        anonymous.list()
    assert refused.value.status_code == 401 and "log in" in refused.value.error
    with pytest.raises(ollama.ResponseError):
        anonymous.chat(model=MODEL, messages=HELLO)
    bob_key = serge(data_dir, "keys", "create", "bob", "--name", "ollama").strip()
    bob = ollama.Client(host=url, headers={"Authorization": f"Bearer {bob_key}"})
    assert bob.chat(model=MODEL, messages=HELLO, options=QUICK).done, "a key is an Ollama client's way in"
    for attempt in (lambda: bob.pull("smollm2-360m-instruct"), lambda: bob.delete(MODEL)):
        with pytest.raises(ollama.ResponseError) as forbidden:
            attempt()
        assert forbidden.value.status_code == 403 and "admins" in forbidden.value.error
    assert LATEST in [m.model for m in bob.list().models], "nothing was deleted"
    with closing(login(url, "alice")) as alice:
        installed = alice.post("/api/pull", json={"model": LATEST, "stream": False})
        assert installed.status_code == 200 and installed.json() == {"status": "success"}, "installed already"


# --- keep_alive and truncation, each on an engine of its own ------------------------------------
@pytest.mark.real_model
def test_keep_alive_zero_unloads_the_model_once_it_is_idle(real_settings, tmp_path_factory):
    own = Settings(data_dir=tmp_path_factory.mktemp("keep-alive"), models_dir=real_settings.models_dir,
                   torch_threads=real_settings.torch_threads, port=held_port())
    with Engine(own) as engine, ServerThread(build_app(own, engine), own.port) as running:
        client = ollama.Client(host=running.url, timeout=300)
        assert client.chat(model=REAL, messages=HELLO, options=QUICK).done
        assert REAL_LATEST in [m.model for m in client.ps().models]
        assert client.chat(model=REAL, messages=HELLO, options=QUICK, keep_alive=0).done
        deadline = time.monotonic() + 10
        while client.ps().models and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.ps().models == []
        assert client.chat(model=REAL, messages=HELLO, options=QUICK).done, "it loads again when asked"
        unloaded = client.generate(model=REAL, keep_alive="0s")
        assert unloaded.done_reason == "unload"


@pytest.mark.real_model
def test_a_plain_users_keep_alive_zero_leaves_loaded_the_model_another_user_is_using(real_settings,
                                                                                     tmp_path_factory):
    own = Settings(data_dir=tmp_path_factory.mktemp("keep-alive-shared"), models_dir=real_settings.models_dir,
                   torch_threads=real_settings.torch_threads, port=held_port())
    with Engine(own) as engine, ServerThread(build_app(own, engine), own.port) as running:
        add_user(own.data_dir, "alice")  # the first account: an admin
        add_user(own.data_dir, "bob")
        alice, bob = (ollama.Client(host=running.url, timeout=300, headers={
            "Authorization": f"Bearer {serge(own.data_dir, 'keys', 'create', name, '--name', 'ollama').strip()}"})
            for name in ("alice", "bob"))
        assert alice.chat(model=REAL, messages=HELLO, options=QUICK).done
        assert bob.chat(model=REAL, messages=HELLO, options=QUICK, keep_alive=0).done
        assert bob.generate(model=REAL, keep_alive=0).done_reason == "unload"
        assert REAL_LATEST in [m.model for m in bob.ps().models], "bob unloaded the model alice is using"
        assert alice.generate(model=REAL, keep_alive=0).done_reason == "unload"
        assert alice.ps().models == [], "an admin's keep_alive 0 unloads it"


def test_a_chat_longer_than_the_window_loses_its_oldest_turns_and_says_so(small_standin_server):
    long_chat = []
    for i in range(40):
        long_chat += [{"role": "user", "content": f"Tell me fact number {i} about the sea, in detail please."},
                      {"role": "assistant", "content": f"Fact {i}: the sea is large, deep and full of salt water."}]
    long_chat.append({"role": "user", "content": "And one more?"})
    body = {"model": MODEL, "messages": long_chat, "stream": False, "options": QUICK}
    trimmed = post(small_standin_server, "/api/chat", body).json()
    assert trimmed["truncated"] is True and trimmed["dropped_messages"] > 10
    assert trimmed["prompt_eval_count"] < SMALL_WINDOW
    refused = post(small_standin_server, "/api/chat", {**body, "truncate": False})
    assert refused.status_code == 400 and set(refused.json()) == {"error"}
    assert str(SMALL_WINDOW) in refused.json()["error"]


@pytest.mark.real_model
def test_a_pull_streams_ollamas_progress_records_and_delete_removes_the_model(tmp_path_factory, fake_hub):
    data = tmp_path_factory.mktemp("ollama-library")
    ModelLibrary(data / "models").import_path(ModelLibrary(models_dir()).find(REAL).transformers_folder(),
                                              "local-a", log=lambda _: None)
    own = Settings(data_dir=data, models_dir=data / "models", hf_endpoint=fake_hub.url, port=held_port(),
                   default_model="local-a")
    fake_hub.reset()
    with Engine(own) as engine, ServerThread(build_app(own, engine), own.port) as running:
        client = ollama.Client(host=running.url, timeout=300)
        spelled = f"hf.co/{GGUF_REPO}:Q4_K_M"  # how Ollama names a hub GGUF
        records = list(client.pull(spelled, stream=True))
        assert records[0].status == "pulling manifest" and records[-1].status == "success"
        downloading = [r for r in records if r.completed is not None]
        assert downloading and downloading[-1].completed == downloading[-1].total > 10**7
        assert all(a.completed <= b.completed for a, b in itertools.pairwise(downloading))
        name = f"{GGUF_REPO.lower()}:q4_k_m"
        assert name in [m.model for m in client.list().models]
        assert client.show(spelled).details.format == "gguf"
        assert client.pull(spelled).status == "success", "a second pull finds it installed"
        assert client.delete(spelled).status == "success"
        assert name not in [m.model for m in client.list().models]
        with pytest.raises(ollama.ResponseError) as gone:
            client.delete(spelled)
        assert gone.value.status_code == 404

        fake_hub.faults.bytes_per_s = 20 * 2**20  # slow enough to be seen half done, then left
        slow = {"model": f"hf.co/{GGUF_REPO}:Q8_0"}
        with httpx.stream("POST", f"{running.url}/api/pull", json=slow, timeout=60) as reply:
            for line in reply.iter_lines():
                record = json.loads(line)
                if record.get("completed", 0) > 5 * 2**20:
                    assert record["completed"] < record["total"] and record["digest"].endswith(".gguf")
                    break
            else:
                pytest.fail("no progress record came before the pull ended")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and [p.state for p in engine.pulls()][-1] == "running":
            time.sleep(0.1)
        assert engine.pulls()[-1].state == "cancelled", "a pull whose client went away stops, as Ollama's does"
        assert f"{GGUF_REPO.lower()}:q8_0" not in [m.model for m in client.list().models]
    fake_hub.reset()


@pytest.fixture(scope="module")
def each_engine(both_engines, real_settings, tmp_path_factory):
    """A server over each local engine in turn (transformers and llama.cpp)."""
    own = real_settings.model_copy(update={"data_dir": tmp_path_factory.mktemp("ollama-each"), "port": held_port()})
    with ServerThread(build_app(own, both_engines), own.port) as running:
        yield ollama.Client(host=running.url, timeout=300)


@pytest.mark.real_model
def test_chat_streams_calls_tools_and_keeps_to_json_on_each_local_engine(each_engine):
    parts = list(each_engine.chat(model=REAL, messages=HELLO, stream=True, options=QUICK))
    assert "".join(p.message.content for p in parts[:-1]) and not any(p.done for p in parts[:-1])
    assert_sane_final(parts[-1])
    called = each_engine.chat(model=REAL, messages=SHOWN_A_CALL, tools=[WEATHER],
                              options={"temperature": 0, "num_predict": 40})
    assert called.message.tool_calls and called.message.tool_calls[0].function.name == "get_weather"
    assert isinstance(called.message.tool_calls[0].function.arguments, dict)
    person = each_engine.generate(model=REAL, prompt="Give a JSON object with the name and age of a person.",
                                  format="json", options={"temperature": 0, "num_predict": 80})
    assert isinstance(json.loads(person.response), dict)


@pytest.mark.real_model
def test_embed_gives_a_vector_per_text_from_the_embedding_model(real_client):
    client = real_client
    reply = client.embed(model="all-minilm-l6-v2", input=["The cat sleeps on the sofa.", "A kitten naps on the couch.",
                                                          "Interest rates rose in March."])
    cat, kitten, rates = reply.embeddings
    assert len(cat) == 384 and reply.prompt_eval_count > 0

    def dot(a, b):
        return sum(x * y for x, y in zip(a, b))

    assert dot(cat, kitten) > dot(cat, rates) + 0.3
    older = client.embeddings(model="all-minilm-l6-v2:latest", prompt="The cat sleeps on the sofa.")
    assert max(abs(a - b) for a, b in zip(older.embedding, cat)) < 1e-5
    default = httpx.post(f"{client._client.base_url}/api/embed", json={"input": "The cat sleeps on the sofa."},
                         timeout=60).json()  # no model named: the default embedding model
    assert default["model"] == "all-minilm-l6-v2:latest"
    assert max(abs(a - b) for a, b in zip(default["embeddings"][0], cat)) < 1e-5


@pytest.mark.real_model
def test_embed_refuses_a_chat_model_in_ollamas_shape(real_url):
    server = real_url
    reply = httpx.post(f"{server}/api/embed", json={"model": REAL, "input": "x"}, timeout=60)
    assert reply.status_code == 400 and "all-minilm-l6-v2" in reply.json()["error"], reply.text
    shown = httpx.post(f"{server}/api/show", json={"model": "all-minilm-l6-v2"}, timeout=30).json()
    assert shown["capabilities"] == ["embedding"]
