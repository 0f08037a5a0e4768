"""Embeddings: the bundled embedding model through /v1/embeddings, spoken to by the official openai client.

On the real embedding model (`real_model`); bad input that is refused before any model is asked, and the
same guards as every route, on the stand-in's server (standin.py)."""

from __future__ import annotations

import base64
import math
import struct

import httpx
import pytest
from openai import OpenAI

from conftest import MODEL, ServerThread, held_port
from standin import stand_in

settings, engine = stand_in("settings", "engine")  # and `standin_server`, the stand-in's shared server
real_model = pytest.mark.real_model  # the real embedding model on a real server

EMBEDDER = "all-minilm-l6-v2"


@pytest.fixture(scope="module")
def server(real_settings, engines, tmp_path_factory):
    """A server over the real models (the bundled chat model and the embedding model)."""
    from conftest import own_server

    with own_server(real_settings, engines("auto"), tmp_path_factory.mktemp("embeddings")) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=f"{server}/v1", api_key="unused")


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


@real_model
def test_a_sentence_is_nearer_its_paraphrase_than_an_unrelated_sentence(client):
    texts = ["The cat is sleeping on the sofa.", "A kitten naps on the couch.", "Interest rates rose again in March."]
    reply = client.embeddings.create(model=EMBEDDER, input=texts)
    cat, kitten, rates = (d.embedding for d in reply.data)
    assert len(cat) == 384 and [d.index for d in reply.data] == [0, 1, 2]
    assert cosine(cat, kitten) > cosine(cat, rates) + 0.3, (cosine(cat, kitten), cosine(cat, rates))
    assert abs(cosine(cat, cat) - 1) < 1e-5 and abs(sum(x * x for x in cat) - 1) < 1e-4  # normalised, as configured
    assert reply.usage.prompt_tokens == reply.usage.total_tokens > 0 and reply.model == EMBEDDER


@real_model
def test_a_batch_gives_each_text_the_vector_it_gets_alone(client):
    texts = ["x " * 200, "short", "a somewhat longer sentence about the weather in spring"]  # not by length
    batch = [d.embedding for d in client.embeddings.create(model=EMBEDDER, input=texts).data]
    for text, vector in zip(texts, batch):
        alone = client.embeddings.create(model=EMBEDDER, input=text).data[0].embedding
        assert max(abs(a - b) for a, b in zip(alone, vector)) < 1e-5


@real_model
def test_every_input_form_and_base64(server, client):
    one = client.embeddings.create(model=EMBEDDER, input="hello world").data[0].embedding
    ids = httpx.post(f"{server}/v1/embeddings", json={"model": EMBEDDER, "input": [7592, 2088]}, timeout=60).json()
    many = httpx.post(f"{server}/v1/embeddings", json={"input": [[7592, 2088], [7592]]}, timeout=60).json()
    assert len(ids["data"]) == 1 and len(many["data"]) == 2 and many["model"] == EMBEDDER  # the default one
    assert ids["usage"]["prompt_tokens"] == 2
    raw = httpx.post(f"{server}/v1/embeddings", timeout=60,
                     json={"model": EMBEDDER, "input": "hello world", "encoding_format": "base64"}).json()
    decoded = struct.unpack(f"<{len(one)}f", base64.b64decode(raw["data"][0]["embedding"]))
    assert max(abs(a - b) for a, b in zip(decoded, one)) < 1e-6
    assert client.embeddings.create(model=EMBEDDER, input="x", dimensions=384).data[0].embedding


@pytest.mark.parametrize("body, param, words", [
    ({"input": []}, "input", "empty"),
    ({"input": ""}, "input", "empty string"),
    ({"input": ["a"] * 2049}, "input", "2048"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format", "float"),
])
def test_bad_input_is_a_400_naming_the_field(standin_server, body, param, words, server=None):
    reply = httpx.post(f"{server or standin_server}/v1/embeddings", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and words in error["message"], error


@real_model
@pytest.mark.parametrize("body, param, words", [
    ({"input": "x", "dimensions": 100}, "dimensions", "384"),
    ({"input": [[10**9]]}, "input", "vocabulary"),
    ({"input": "x", "model": MODEL}, "model", EMBEDDER),
])
def test_bad_input_for_the_model_is_a_400_naming_the_field(server, body, param, words):
    test_bad_input_is_a_400_naming_the_field(None, body, param, words, server)


@real_model
def test_a_chat_request_to_the_embedding_model_names_the_models_that_chat(server):
    reply = httpx.post(f"{server}/v1/chat/completions", timeout=60,
                       json={"model": EMBEDDER, "messages": [{"role": "user", "content": "hi"}]})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "model"
    assert "embedding model" in reply.json()["error"]["message"] and MODEL in reply.json()["error"]["message"]


@real_model
def test_the_model_list_says_which_kind_each_model_is(server):
    models = {m["name"]: m for m in httpx.get(f"{server}/api/models", timeout=30).json()["data"]}
    assert models[EMBEDDER]["kind"] == "embedding" and models[MODEL]["kind"] == "chat"
    assert EMBEDDER in {m["id"] for m in httpx.get(f"{server}/v1/models", timeout=30).json()["data"]}


@real_model
def test_health_describes_a_loaded_embedding_model_as_it_describes_itself(server, client):
    """Each loaded model makes its own row: an encoder has no KV cache to tell (a chat model on llama.cpp has)."""
    client.embeddings.create(model=EMBEDDER, input="warm")
    loaded = {m["name"]: m for m in httpx.get(f"{server}/api/health", timeout=30).json()["models_loaded"]}
    embedder = loaded[EMBEDDER]
    assert embedder["engine"] == "transformers" and embedder["kv_cache"] == "" and embedder["device"] == "cpu"
    assert embedder["memory_bytes"] > 0 and embedder["gpu_bytes"] == 0


def test_a_hostile_page_gets_no_embedding(standin_server):
    server = standin_server
    cross = httpx.post(f"{server}/v1/embeddings", json={"input": "x"}, timeout=30,
                       headers={"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"})
    rebound = httpx.post(f"{server}/v1/embeddings", json={"input": "x"}, timeout=30, headers={"Host": "evil.example"})
    assert cross.status_code == 403 and rebound.status_code == 421


def test_with_accounts_no_key_no_embedding(settings, engine, tmp_path_factory):
    from test_accounts_api import add_user
    from serge.settings import Settings
    from serge.web.app import build_app

    own = Settings(data_dir=tmp_path_factory.mktemp("embed-accounts"), models_dir=settings.models_dir)
    with ServerThread(build_app(own, engine), held_port()) as running:
        add_user(own.data_dir, "carol")
        refused = httpx.post(f"{running.url}/v1/embeddings", json={"input": "x"}, timeout=30)
        assert refused.status_code == 401, refused.text


@real_model
def test_langchains_openai_embeddings_work_against_it(server):
    """LangChain sends OpenAI's tiktoken ids unless told not to; sent as text (either way it offers), the
    vectors are the ones the openai client gets."""
    from langchain_openai import OpenAIEmbeddings

    from conftest import models_dir
    from serge.engine.models.library import ModelLibrary

    texts = ["The cat is sleeping on the sofa.", "A kitten naps on the couch."]
    direct = [d.embedding for d in OpenAI(base_url=f"{server}/v1", api_key="unused").embeddings.create(
        model=EMBEDDER, input=texts).data]
    as_text = OpenAIEmbeddings(base_url=f"{server}/v1", api_key="unused", model=EMBEDDER,
                               check_embedding_ctx_length=False)
    own_tokenizer = OpenAIEmbeddings(base_url=f"{server}/v1", api_key="unused", model=EMBEDDER,
                                     tiktoken_enabled=False, embedding_ctx_length=256,
                                     tiktoken_model_name=str(ModelLibrary(models_dir()).find(EMBEDDER).path))
    for embedder in (as_text, own_tokenizer):
        vectors = embedder.embed_documents(texts)
        assert [len(v) for v in vectors] == [384, 384]
        assert all(cosine(a, b) > 0.9999 for a, b in zip(vectors, direct))
        assert cosine(embedder.embed_query(texts[0]), direct[0]) > 0.9999
