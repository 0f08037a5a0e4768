"""GGUF embedding models on llama.cpp: the bundled embedding model made a GGUF here, served beside its torch self."""

from __future__ import annotations

import math

import httpx
import ollama
import pytest
from openai import OpenAI

from conftest import ServerThread, free_port, models_dir
from standin import NAME, standin_engine
from serge.engine.llamacpp.gguf.bert import write_bert_gguf
from serge.engine.models.library import ModelLibrary
from serge.settings import Settings
from serge.web.app import build_app

pytestmark = pytest.mark.real_model  # the bundled embedding model's own weights, on both engines

TORCH, GGUF = "all-minilm-l6-v2", "all-minilm-l6-v2-gguf"
TEXTS = ["The cat is sleeping on the sofa.", "A kitten naps on the couch.", "Interest rates rose again in March.",
         "x " * 200, "naïve café déjà vu — ünïcödé"]


def cosine(a, b) -> float:
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The bundled embedding model's folder, and a float16 GGUF of it."""
    source = ModelLibrary(models_dir()).find(TORCH).path
    return source, write_bert_gguf(source, tmp_path_factory.mktemp("gguf-embed") / "all-MiniLM-L6-v2.F16.gguf")


@pytest.fixture(scope="module")
def library(made, tmp_path_factory):
    """A library holding the bundled embedding model twice: as installed, and as the GGUF (imported)."""
    library = ModelLibrary(tmp_path_factory.mktemp("models"))
    library.import_path(made[0], TORCH, log=lambda _: None)
    library.import_path(made[1], GGUF, log=lambda _: None)
    return library


@pytest.fixture(scope="module")
def engine(library, tmp_path_factory):
    """Chats go to the stand-in (no chat model is needed here), embeddings to the library's two."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("data"), models_dir=library.models_dir, torch_threads=1,
                        default_model=NAME, default_embedding_model=GGUF)
    with standin_engine(settings) as engine:
        yield engine


@pytest.fixture(scope="module")
def server(engine):
    port = free_port()
    with ServerThread(build_app(engine.settings.model_copy(update={"port": port}), engine), port) as running:
        yield running.url


def test_the_library_reads_kind_and_dimensions_from_the_gguf_metadata(library, engine):
    facts = library.find(GGUF).facts
    assert (facts.format, facts.kind, facts.dimensions, facts.architecture) == ("gguf", "embedding", 384, "bert")
    assert (engine.info(GGUF).kind, engine.info(GGUF).engine, engine.info(TORCH).engine) == (
        "embedding", "llama.cpp", "transformers")


def test_the_hub_pull_takes_a_gguf_embedding_repo(made, tmp_path):
    from hubserver import FakeHub

    with FakeHub() as hub:
        hub.add("serge-tests/all-MiniLM-L6-v2-GGUF", {"README.md": made[0] / "config.json", made[1].name: made[1]})
        pulled = ModelLibrary(tmp_path / "models", hub_endpoint=hub.url).pull("serge-tests/all-MiniLM-L6-v2-GGUF",
                                                                              log=lambda _: None)
    assert (pulled.facts.kind, pulled.facts.dimensions, pulled.gguf_path.name) == ("embedding", 384, made[1].name)


def test_its_vectors_are_the_torch_embedders_for_the_same_texts(engine):
    ours = engine.embed(GGUF, TEXTS).vectors.tolist()
    torch = engine.embed(TORCH, TEXTS).vectors.tolist()
    for text, a, b in zip(TEXTS, ours, torch):
        assert cosine(a, b) > 0.99, (text, cosine(a, b))
    assert all(abs(sum(x * x for x in v) - 1) < 1e-4 for v in ours)  # normalised, as llama.cpp's server does


def test_a_batch_gives_each_text_the_vector_it_gets_alone(engine):
    """Each text is its own sequence in the batch's one decode; what differs is rounding alone (llama.cpp's CPU
    kernels round activations to float16 for float16 weights, in blocks that depend on the batch's shape)."""
    batch = engine.embed(GGUF, TEXTS).vectors.tolist()
    for text, vector in zip(TEXTS, batch):
        alone = engine.embed(GGUF, [text]).vectors[0].tolist()
        assert max(abs(a - b) for a, b in zip(alone, vector)) < 1e-4, text


def test_token_ids_are_taken_as_they_are(engine):
    ids = engine.embed(GGUF, [[101, 7592, 2088, 102]])  # [CLS] hello world [SEP]
    text = engine.embed(GGUF, ["hello world"])
    assert ids.prompt_tokens == text.prompt_tokens == 4
    assert max(abs(a - b) for a, b in zip(ids.vectors[0].tolist(), text.vectors[0].tolist())) < 1e-6


def test_v1_embeddings_and_ollamas_api_embed_serve_it(server, engine):
    reply = OpenAI(base_url=f"{server}/v1", api_key="unused").embeddings.create(model=GGUF, input=TEXTS[:3])
    cat, kitten, rates = (d.embedding for d in reply.data)
    assert len(cat) == 384 and reply.model == GGUF and reply.usage.prompt_tokens > 0
    assert cosine(cat, kitten) > cosine(cat, rates) + 0.3
    ollamas = ollama.Client(host=server).embed(model=GGUF, input=TEXTS[:3]).embeddings
    assert max(abs(a - b) for a, b in zip(ollamas[0], cat)) < 1e-6
    default = httpx.post(f"{server}/v1/embeddings", json={"input": "x"}, timeout=60).json()
    assert default["model"] == GGUF  # the default embedding model
    refused = httpx.post(f"{server}/v1/embeddings", json={"model": GGUF, "input": "x", "dimensions": 100}, timeout=60)
    assert refused.status_code == 400 and "384" in refused.json()["error"]["message"]
    chat = httpx.post(f"{server}/v1/chat/completions", timeout=60,
                      json={"model": GGUF, "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 400 and "embedding model" in chat.json()["error"]["message"]
