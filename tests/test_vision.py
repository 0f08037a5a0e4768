"""Images for vision models: a random-weight tiny LLaVA (tests/tiny_vlm.py) on the transformers engine, beside
the stand-in as a text-only model. An image reaches the model, each dialect's image part is parsed into the
engine's `Image`, a text-only model answers 400 naming the one that sees, an image by URL is refused (nothing
fetched), hostile images are 4xx naming the limit, and on the chat page, in Debian's Chromium, an image sent
shows as a thumbnail. No real model loads: only the bundled model's tokenizer files are read, for the tiny
model's text side."""

from __future__ import annotations

import struct
import zlib

import httpx
import pytest

import tiny_vlm
from conftest import CHROMIUM, MODEL, drop, free_port, models_dir, open_chat, own_server
from standin import NAME as TEXT_ONLY, standin_model
from test_chats_api import events_of
from tiny_vlm import IMAGE_TOKENS, NAME, b64, data_url, png
from serge.engine import (ChatRequest, Engine, ImageRefused, ImageTooLarge, Message, ModelLibrary, SamplingParams,
                          read_image)
from serge.engine.generation.prompting.images import MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS
from serge.engine.models.facts import read_facts
from serge.settings import Settings

ASK = "What is in the picture?"


@pytest.fixture(scope="session")
def vlm_folder(tmp_path_factory):
    """Built once per session (a second or two): the tokenizer files only of the installed bundled model."""
    return tiny_vlm.build(tmp_path_factory.mktemp("tiny-vlm"), ModelLibrary(models_dir()).find(MODEL).folder)


def vision_fixtures(model: str, name: str, kind: str):
    """Module fixtures `engine` (the vision model that fixture `model` makes, imported as `name` and served on
    engine `kind`, beside the stand-in as a text-only model) and `client` (a real server over it):
    `engine, client = vision_fixtures(...)` at module top."""

    @pytest.fixture(scope="module", name="engine")
    def engine_fixture(request, tmp_path_factory):
        root = tmp_path_factory.mktemp(f"vision-{kind}")
        settings = Settings(data_dir=root / "data", models_dir=root / "models", engine=kind, default_model=name,
                            port=free_port())
        text_only = standin_model()
        with Engine(settings, backends={TEXT_ONLY: text_only}) as engine:
            engine.import_model(request.getfixturevalue(model), name, log=lambda line: None)
            yield engine
        text_only.close()

    @pytest.fixture(scope="module", name="client")
    def client_fixture(engine, tmp_path_factory):
        with own_server(engine.settings, engine, tmp_path_factory.mktemp("vision-server")) as url, \
                httpx.Client(base_url=url, timeout=120) as http:
            yield http

    return engine_fixture, client_fixture


engine, client = vision_fixtures("vlm_folder", NAME, "transformers")


def first_token_scores(engine, images: tuple = (), name: str = NAME) -> tuple[int, list]:
    """The prompt's length and the first reply token's top alternatives, greedy."""
    stream = engine.chat(name, ChatRequest([Message("user", ASK, images=images)],
                                           SamplingParams(max_new_tokens=1, temperature=0, logprobs=5)))
    tokens = [t for delta in stream.deltas() for t in delta.tokens]
    assert stream.record.error is None, stream.record.error
    return stream.prompt_tokens, [(t.token, t.logprob) for t in tokens[0].top]


def test_the_library_says_which_model_sees_images(engine, vlm_folder, client):
    assert read_facts(vlm_folder).vision
    assert engine.info(NAME).vision and not engine.info(TEXT_ONLY).vision
    listed = {m["name"]: m["vision"] for m in client.get("/api/models").json()["data"]}
    assert listed[NAME] is True and listed[TEXT_ONLY] is False
    assert "sees images" in client.get("/models").text


def two_images(engine, name: str = NAME) -> tuple[int, int, list, list, list, list]:
    """Prompt lengths without and with an image, and the first token's scores: no image, red, blue, then red
    again after blue (so no KV of another image may be reused)."""
    red, blue = read_image(png("red")), read_image(png("blue"))
    plain_length, plain = first_token_scores(engine, (), name)
    length, with_red = first_token_scores(engine, (red,), name)
    return (plain_length, length, plain, with_red, first_token_scores(engine, (blue,), name)[1],
            first_token_scores(engine, (red,), name)[1])


def test_an_image_reaches_the_model_and_two_images_give_different_logits(engine):
    plain_length, length, plain, with_red, with_blue, red_again = two_images(engine)
    assert length == plain_length + IMAGE_TOKENS  # the template's <image> became the processor's run of tokens
    assert with_red != with_blue and with_red != plain
    assert red_again == with_red


def test_each_dialect_parses_its_image_part(client):
    url, raw = data_url(png("green")), b64(png("green"))
    openai = client.post("/v1/chat/completions", json={"model": NAME, "max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": ASK}]}]})
    plain = client.post("/v1/chat/completions", json={"model": NAME, "max_tokens": 2, "messages": [
        {"role": "user", "content": ASK}]})
    assert openai.status_code == 200, openai.text
    assert openai.json()["usage"]["prompt_tokens"] == plain.json()["usage"]["prompt_tokens"] + IMAGE_TOKENS
    anthropic = client.post("/v1/messages", json={"model": NAME, "max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": raw}},
        {"type": "text", "text": ASK}]}]})
    assert anthropic.status_code == 200, anthropic.text
    assert anthropic.json()["usage"]["input_tokens"] == plain.json()["usage"]["prompt_tokens"] + IMAGE_TOKENS
    responses = client.post("/v1/responses", json={"model": NAME, "max_output_tokens": 2, "store": False, "input": [
        {"role": "user", "content": [{"type": "input_image", "image_url": url}, {"type": "input_text", "text": ASK}]}]})
    assert responses.status_code == 200, responses.text
    assert responses.json()["usage"]["input_tokens"] == plain.json()["usage"]["prompt_tokens"] + IMAGE_TOKENS
    ollama = client.post("/api/chat", json={"model": NAME, "stream": False, "options": {"num_predict": 2},
                                            "messages": [{"role": "user", "content": ASK, "images": [raw]}]})
    assert ollama.status_code == 200, ollama.text
    assert ollama.json()["prompt_eval_count"] == plain.json()["usage"]["prompt_tokens"] + IMAGE_TOKENS


def test_a_text_only_model_asked_about_an_image_names_the_models_that_see(client):
    reply = client.post("/v1/chat/completions", json={"model": TEXT_ONLY, "max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(png("red"))}}]}]})
    assert reply.status_code == 400
    message = reply.json()["error"]["message"]
    assert "cannot see images" in message and NAME in message
    ollama = client.post("/api/chat", json={"model": TEXT_ONLY, "stream": False,
                                            "messages": [{"role": "user", "content": ASK, "images": [b64(png("red"))]}]})
    assert ollama.status_code == 400 and NAME in ollama.json()["error"]


@pytest.mark.parametrize("url", ["https://example.com/cat.png", "http://127.0.0.1:1/cat.png", "file:///etc/passwd"])
def test_an_image_by_url_is_refused_and_nothing_is_fetched(client, url):
    openai = client.post("/v1/chat/completions", json={"model": NAME, "max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]})
    assert openai.status_code == 400 and "never fetches" in openai.json()["error"]["message"]
    anthropic = client.post("/v1/messages", json={"model": NAME, "max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": url}}]}]})
    assert anthropic.status_code == 400 and "never fetches" in anthropic.json()["error"]["message"]
    responses = client.post("/v1/responses", json={"model": NAME, "max_output_tokens": 2, "store": False, "input": [
        {"role": "user", "content": [{"type": "input_image", "image_url": url}]}]})
    assert responses.status_code == 400 and "never fetches" in responses.json()["error"]["message"]


def _png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header claims `width` x `height` and whose data is a few bytes."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 10)) + chunk(b"IEND", b"")


def test_hostile_images_are_refused_naming_the_limit():
    with pytest.raises(ImageTooLarge, match=str(MAX_IMAGE_PIXELS)):
        read_image(_png_claiming(100_000, 100_000))  # a bomb by its header: refused before a pixel is decoded
    with pytest.raises(ImageTooLarge, match="says it is 9000x9000 pixels; the limit"):
        read_image(_png_claiming(9000, 9000))  # past Serge's limit, below Pillow's own guard
    with pytest.raises(ImageRefused, match="shorter than its header"):
        read_image(_png_claiming(64, 64))  # lies about its size: far fewer pixels than it claims
    with pytest.raises(ImageRefused, match="not an image"):
        read_image(b"%PDF-1.4 not a picture")
    with pytest.raises(ImageTooLarge, match=str(MAX_IMAGE_BYTES)):
        read_image(b"\0" * (MAX_IMAGE_BYTES + 1))
    whole = png("red")
    with pytest.raises(ImageRefused):
        read_image(whole[: len(whole) // 2])  # cut short
    assert read_image(whole).width == 40


def test_a_hostile_image_is_a_4xx_in_each_dialect(client):
    bomb = b64(_png_claiming(50_000, 50_000))
    openai = client.post("/v1/chat/completions", json={"model": NAME, "max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{bomb}"}}]}]})
    assert openai.status_code == 413 and "pixels" in openai.json()["error"]["message"]
    assert openai.json()["error"]["param"] == "messages.0.content.0.image_url.url"
    anthropic = client.post("/v1/messages", json={"model": NAME, "max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(b"GIF89a broken")}}]}]})
    assert anthropic.status_code == 400 and anthropic.json()["type"] == "error"
    ollama = client.post("/api/chat", json={"model": NAME, "stream": False,
                                            "messages": [{"role": "user", "content": ASK, "images": ["not base64!"]}]})
    assert ollama.status_code == 400
    many = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(png("red"))}}]}] * 17
    crowded = client.post("/v1/chat/completions", json={"model": NAME, "max_tokens": 2, "messages": many})
    assert crowded.status_code == 413 and "the limit is 16" in crowded.json()["error"]["message"]


def test_an_image_attached_in_the_chat_api_reaches_the_model_and_shows_as_a_thumbnail(client):
    settings = {"max_new_tokens": 2, "temperature": 0}
    with_image = client.post("/api/chats", json={"model": NAME, "settings": settings}).json()["id"]
    plain = client.post("/api/chats", json={"model": NAME, "settings": settings}).json()["id"]
    picture = png("orange")
    uploaded = client.post(f"/api/chats/{with_image}/files", files={"file": ("photo.png", picture, "image/png")})
    assert uploaded.status_code == 201, uploaded.text
    image_id = uploaded.json()["id"]
    seen = events_of(client, f"/api/chats/{with_image}/messages", {"content": ASK, "attachments": [image_id]})[-1][1]["message"]
    unseen = events_of(client, f"/api/chats/{plain}/messages", {"content": ASK})[-1][1]["message"]
    assert seen["prompt_tokens"] == unseen["prompt_tokens"] + IMAGE_TOKENS
    assert f'/api/chats/{with_image}/files/{image_id}/image' in client.get(f"/c/{with_image}/conversation").text
    served = client.get(f"/api/chats/{with_image}/files/{image_id}/image")
    assert served.content == picture and served.headers["content-type"] == "image/png"
    lying = client.post(f"/api/chats/{with_image}/files", files={"file": ("huge.png", _png_claiming(9000, 9000))})
    assert lying.status_code == 413 and "pixels" in lying.json()["error"]["message"], lying.text


def test_an_image_attached_to_a_text_only_chat_is_a_400_naming_the_models_that_see(client):
    chat = client.post("/api/chats", json={"model": TEXT_ONLY, "settings": {"max_new_tokens": 2}}).json()["id"]
    image_id = client.post(f"/api/chats/{chat}/files", files={"file": ("photo.png", png("red"))}).json()["id"]
    reply = client.post(f"/api/chats/{chat}/messages", json={"content": ASK, "attachments": [image_id]})
    assert reply.status_code == 400, reply.text
    assert "cannot see images" in reply.json()["error"]["message"] and NAME in reply.json()["error"]["message"]


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's Chromium is not installed (apt-get install chromium)")
def test_an_image_sent_to_a_vision_model_shows_as_a_thumbnail_in_the_message(page, client):
    expect = pytest.importorskip("playwright.sync_api").expect
    # the random model's reply of up to 1,024 tokens is not the point
    open_chat(page, str(client.base_url).rstrip("/"), max_tokens=4)
    drop(page, "photo.png", png("purple", (64, 48)), "image/png")
    chip = page.locator("#attachments .attachment img")
    expect(chip).to_have_count(1)
    box = page.get_by_label("Message")
    box.fill("What colour is this?")
    box.press("Enter")
    thumb = page.locator('[data-role="user"] img.thumb')
    expect(thumb).to_have_count(1, timeout=60_000)
    page.wait_for_function("() => { const i = document.querySelector('[data-role=\"user\"] img.thumb');"
                           " return i && i.complete && i.naturalWidth === 64; }")  # loaded, past the page's CSP
    expect(page.locator("#attachments")).to_be_hidden()


def _tiny_gguf(path) -> None:
    import numpy as np
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_gguf_sees_images_by_its_mmproj_file_where_llama_cpp_has_mtmd(tmp_path):
    from serge.engine.info import sees_images

    _tiny_gguf(tmp_path / "model-Q4_K_M.gguf")
    assert not read_facts(tmp_path, "model-Q4_K_M.gguf").vision
    _tiny_gguf(tmp_path / "mmproj-model-f16.gguf")
    facts = read_facts(tmp_path, "model-Q4_K_M.gguf")
    assert facts.vision and not read_facts(tmp_path, "mmproj-model-f16.gguf").vision
    assert sees_images(facts, "llama.cpp", mtmd=True)
    assert not sees_images(facts, "llama.cpp", mtmd=False)  # without mtmd the Models page says "vision: not here"
    assert not sees_images(facts, "transformers", mtmd=True)  # a GGUF converted for transformers keeps no projector
