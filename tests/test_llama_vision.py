"""Images on the llama.cpp engine through its multimodal library (mtmd): a random-weight vision GGUF pair written
in the test (tests/tiny_gguf_vlm.py: a tiny Llama and the mmproj of a tiny CLIP with LLaVA's MLP projector), beside
the stand-in as a text-only model. An image reaches the model, each dialect's image part reaches it, a text-only
model answers 400 naming this one, and a hub pull or an import of a vision GGUF brings its mmproj. No real model
loads, and nothing is downloaded.

Where the installed llama_cpp was built without mtmd (LLAVA_BUILD=OFF), the tests that run the model skip."""

from __future__ import annotations

import pytest

from standin import NAME as TEXT_ONLY
from test_vision import ASK, two_images, vision_fixtures
from tiny_gguf_vlm import IMAGE_TOKENS, write_pair
from tiny_vlm import b64, data_url, png
from serge.engine import (ChatRequest, EngineMetrics, InvalidRequest, Message, ModelLibrary, SamplingParams,
                          read_image)
from serge.engine.devices import resolve_device
from serge.engine.generation.batching.admission import SchedulerLimits
from serge.engine.llamacpp import memory as llama_memory
from serge.engine.llamacpp.vision import mtmd_available
from serge.engine.llamacpp.options import LlamaOptions
from serge.engine.registry import ModelRegistry
from serge.engine.models.hub import HubSource, _choose, choose_mmproj

NAME = "tiny-gguf-vlm"
needs_mtmd = pytest.mark.skipif(not mtmd_available(), reason="this llama-cpp-python was built without mtmd "
                                                             "(LLAVA_BUILD=OFF); `rm .venv/.llama && make run` "
                                                             "rebuilds it with mtmd")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The text GGUF, with its mmproj beside it (a fraction of a second to write)."""
    return write_pair(tmp_path_factory.mktemp("tiny-gguf-vlm"))


engine, client = vision_fixtures("pair", NAME, "llama.cpp")


def test_an_imported_gguf_brings_its_mmproj_and_is_listed_as_seeing_where_llama_cpp_has_mtmd(engine, client):
    installed = ModelLibrary(engine.settings.models_path).find(NAME)
    assert installed.mmproj_path is not None and installed.mmproj_path.parent == installed.folder
    assert installed.facts.vision
    assert engine.info(NAME).engine == "llama.cpp"
    assert engine.info(NAME).vision is mtmd_available()
    listed = {m["name"]: m["vision"] for m in client.get("/api/models").json()["data"]}
    assert listed[NAME] is mtmd_available() and listed[TEXT_ONLY] is False


def test_the_memory_estimate_before_a_load_counts_the_mmproj_llama_cpp_loads_beside_the_weights(engine):
    library = ModelLibrary(engine.settings.models_path)
    installed = library.find(NAME)
    options = LlamaOptions(resolve_device("cpu", "float32"), 1, 512, SchedulerLimits(), EngineMetrics())
    registry = ModelRegistry(library, options, "llama.cpp")
    projector = installed.mmproj_path.stat().st_size if mtmd_available() else 0  # without mtmd it is never loaded
    assert projector or not mtmd_available()
    assert registry.estimate(installed) == llama_memory.estimate(installed.facts, options) + projector


def test_an_import_beside_several_projectors_takes_none(pair, tmp_path):
    (pair.parent / "mmproj-other-f32.gguf").write_bytes((pair.parent / "mmproj-tiny-gguf-vlm-f16.gguf").read_bytes())
    try:
        lines: list[str] = []
        installed = ModelLibrary(tmp_path / "models").import_path(pair, "two-projectors", log=lines.append)
    finally:
        (pair.parent / "mmproj-other-f32.gguf").unlink()
    assert installed.mmproj_path is None and not installed.facts.vision
    assert any("none taken" in line for line in lines)


@needs_mtmd
def test_an_image_reaches_the_llama_cpp_model_and_two_images_give_different_logits(engine):
    plain_length, length, plain, with_red, with_blue, red_again = two_images(engine, NAME)
    assert length >= plain_length + IMAGE_TOKENS  # the marker became the image's run of positions
    assert with_red != with_blue and with_red != plain
    assert red_again == with_red


@needs_mtmd
def test_a_prompt_with_an_image_is_never_taken_from_the_prefix_cache(engine):
    """Images are not in the token ids: a second turn after an image runs the whole prompt again."""
    red, blue = read_image(png("red")), read_image(png("blue"))
    params = SamplingParams(max_new_tokens=3, temperature=0)
    first = engine.chat(NAME, ChatRequest([Message("user", ASK, images=(red,))], params)).text()
    before = engine.metrics.snapshot()[NAME].reused_tokens
    turn = [Message("user", ASK, images=(blue,)), Message("assistant", first), Message("user", "And now?")]
    engine.chat(NAME, ChatRequest(turn, params)).text()
    assert engine.metrics.snapshot()[NAME].reused_tokens == before


@needs_mtmd
def test_each_dialect_image_part_reaches_the_llama_cpp_model(client):
    url, raw = data_url(png("green")), b64(png("green"))
    plain = client.post("/v1/chat/completions", json={"model": NAME, "max_tokens": 2, "messages": [
        {"role": "user", "content": ASK}]})
    with_image = plain.json()["usage"]["prompt_tokens"] + IMAGE_TOKENS
    openai = client.post("/v1/chat/completions", json={"model": NAME, "max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": ASK}]}]})
    assert openai.status_code == 200, openai.text
    assert openai.json()["usage"]["prompt_tokens"] >= with_image
    anthropic = client.post("/v1/messages", json={"model": NAME, "max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": raw}},
        {"type": "text", "text": ASK}]}]})
    assert anthropic.status_code == 200, anthropic.text
    assert anthropic.json()["usage"]["input_tokens"] == openai.json()["usage"]["prompt_tokens"]
    responses = client.post("/v1/responses", json={"model": NAME, "max_output_tokens": 2, "store": False, "input": [
        {"role": "user", "content": [{"type": "input_image", "image_url": url}, {"type": "input_text", "text": ASK}]}]})
    assert responses.status_code == 200, responses.text
    assert responses.json()["usage"]["input_tokens"] == openai.json()["usage"]["prompt_tokens"]
    ollama = client.post("/api/chat", json={"model": NAME, "stream": False, "options": {"num_predict": 2},
                                            "messages": [{"role": "user", "content": ASK, "images": [raw]}]})
    assert ollama.status_code == 200, ollama.text
    assert ollama.json()["prompt_eval_count"] == openai.json()["usage"]["prompt_tokens"]


@needs_mtmd
def test_a_text_only_model_asked_about_an_image_names_the_llama_cpp_model_that_sees(engine):
    with pytest.raises(InvalidRequest, match=f"cannot see images.*{NAME}"):
        engine.chat(TEXT_ONLY, ChatRequest([Message("user", ASK, images=(read_image(png("red")),))]))


@needs_mtmd
def test_a_user_typing_the_media_marker_adds_no_image(engine):
    """The marker is the template's markup only: in a message's text it is characters, never an image slot."""
    red = read_image(png("red"))
    stream = engine.chat(NAME, ChatRequest([Message("user", "<__media__> " + ASK, images=(red,))],
                                       SamplingParams(max_new_tokens=1, temperature=0)))
    stream.text()
    assert stream.record.error is None, stream.record.error
    plain = engine.chat(NAME, ChatRequest([Message("user", "<__media__> " + ASK)], SamplingParams(max_new_tokens=1)))
    plain.text()
    assert stream.prompt_tokens < plain.prompt_tokens + 2 * IMAGE_TOKENS


@pytest.mark.parametrize("files, chosen", [
    (["a-Q4_K_M.gguf"], []),
    (["a-Q4_K_M.gguf", "mmproj-a-f16.gguf"], ["mmproj-a-f16.gguf"]),
    (["a-Q4_K_M.gguf", "mmproj-F32.gguf", "mmproj-BF16.gguf", "mmproj-F16.gguf"], ["mmproj-F16.gguf"]),
    (["a-Q4_K_M.gguf", "mmproj-F32.gguf", "mmproj-BF16.gguf"], ["mmproj-BF16.gguf"]),
    (["a-Q4_K_M.gguf", "mmproj-model-x.gguf", "mmproj-model-y.gguf"], ["mmproj-model-x.gguf"]),  # the smallest
])
def test_a_vision_gguf_repo_pull_takes_one_projector(files, chosen):
    sizes = {f: 20 if f == "mmproj-model-y.gguf" else 10 for f in files}
    assert choose_mmproj(files, sizes) == chosen
    assert _choose(HubSource.parse("org/a-GGUF:Q4_K_M"), sizes) == (["a-Q4_K_M.gguf", *chosen], "a-Q4_K_M.gguf")


def test_a_hub_pull_of_a_vision_gguf_repo_fetches_its_mmproj(pair, tmp_path):
    from hubserver import FakeHub

    files = {p.name: p for p in pair.parent.iterdir()}
    with FakeHub() as hub:
        hub.add("serge-tests/tiny-gguf-vlm-GGUF", files)
        library = ModelLibrary(tmp_path / "models", hub_endpoint=hub.url)
        installed = library.pull("serge-tests/tiny-gguf-vlm-GGUF", log=lambda line: None)
        served = dict(hub.served)
    assert installed.gguf_path.name == pair.name
    assert installed.mmproj_path is not None and installed.mmproj_path.name == "mmproj-tiny-gguf-vlm-f16.gguf"
    assert installed.facts.vision
    assert served["serge-tests/tiny-gguf-vlm-GGUF/mmproj-tiny-gguf-vlm-f16.gguf"] > 0
