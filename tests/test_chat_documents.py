"""Files in a chat, through the chat API on a real server over the stand-in model (tests/standin.py) and a
stand-in embedder: a file goes in whole when it fits, else the passages that answer the question do, with their
file and page as the reply's sources; each bad file a clear 4xx; files go with their chat."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
import torch

import documents as files
from conftest import own_server
from standin import NAME, standin_model
from test_chats_api import SHORT, send

from serge.engine import Engine
from serge.engine.embeddings import Embeddings
from serge.documents import MAX_FILE_BYTES, MAX_FILES_PER_MESSAGE

EMBEDDER = "hash-embedder"
QUESTION = "What is the name of the lighthouse keeper on Skerry Island?"


class HashEmbedder:
    """Words hashed into 256 buckets: texts sharing words are near (meaning is the real model's test)."""

    name, engine, kind, source, context_window = EMBEDDER, "stand-in", "embedding", "tests", 512

    def embed(self, texts, dimensions=None, party="") -> Embeddings:
        vectors = torch.zeros(len(texts), 256)
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                vectors[row, int(hashlib.sha256(word.encode()).hexdigest(), 16) % 256] += 1.0
        return Embeddings(torch.nn.functional.normalize(vectors, dim=1), sum(len(t) for t in texts), EMBEDDER)


class Recording:
    """The stand-in chat model, keeping the conversations it was asked to answer."""

    def __init__(self, model) -> None:
        self.model, self.asked = model, []

    def submit(self, request):
        self.asked.append(list(request.messages))
        return self.model.submit(request)

    def __getattr__(self, name):
        return getattr(self.model, name)


@pytest.fixture(scope="module")
def recorder():
    model = standin_model()
    yield Recording(model)
    model.close()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("documents-data")


@contextmanager
def documents_engine(standin_settings, recorder) -> Iterator[tuple]:
    """(settings, engine) over the recording stand-in, with the hash embedder as the embedding model."""
    settings = standin_settings.model_copy(update={"default_embedding_model": EMBEDDER})
    with Engine(settings, backends={NAME: recorder, EMBEDDER: HashEmbedder()}) as engine:
        yield settings, engine


@pytest.fixture(scope="module")
def client(standin_settings, recorder, data_dir):
    with documents_engine(standin_settings, recorder) as (settings, engine), \
            own_server(settings, engine, data_dir) as url, httpx.Client(base_url=url, timeout=120) as http:
        yield http


def new_chat(client) -> str:
    return client.post("/api/chats", json={"settings": SHORT}).json()["id"]


def upload(client, chat_id: str, name: str, data: bytes) -> httpx.Response:
    return client.post(f"/api/chats/{chat_id}/files", files={"file": (name, data, "application/octet-stream")})


def asked_text(recorder) -> str:
    return recorder.asked[-1][-1].content


def test_a_fact_only_on_page_three_reaches_the_prompt_and_the_sources_name_page_three(client, recorder):
    chat = new_chat(client)
    uploaded = upload(client, chat, "minutes.pdf", files.long_report_pdf())
    assert uploaded.status_code == 201, uploaded.text
    doc = uploaded.json()
    assert doc["name"] == "minutes.pdf" and doc["pages"] == 12
    _, reply = send(client, f"/api/chats/{chat}/messages", {"content": QUESTION, "attachments": [doc["id"]]})
    prompt = asked_text(recorder)
    assert files.PAGE_THREE_FACT in " ".join(prompt.split()) and prompt.rstrip().endswith(QUESTION)
    assert len(prompt) < len(files.long_report_pdf())  # passages, not the whole file
    top = reply["sources"][0]
    assert top["file"] == "minutes.pdf" and top["page"] == 3 and "Ottoline" in top["passage"].replace("\n", " ")
    assert top["score"] > 0 and top["word_rank"] == 1 and top["vector_rank"] is not None
    saved = client.get(f"/api/chats/{chat}").json()["messages"]
    assert saved[0]["attachments"] == [doc["id"]] and saved[1]["sources"] == reply["sources"]
    exported = client.get(f"/api/chats/{chat}/export").json()["messages"]
    assert exported[1]["sources"] == reply["sources"]
    listed = re.findall(r'<li class="source" title="[^"]*">([^<]*)</li>', client.get(f"/c/{chat}/conversation").text)
    places = list(dict.fromkeys(f"{s['file']}, page {s['page']}" for s in reply["sources"]))
    assert listed == places, "the page lists each file and page once, in the order first used"

    # a follow-up in the same chat still reads the file attached before
    send(client, f"/api/chats/{chat}/messages", {"content": "And who keeps the lighthouse on Skerry Island?"})
    assert "Ottoline" in asked_text(recorder)


def test_small_files_go_in_whole_marked_with_their_names(client, recorder):
    chat = new_chat(client)
    ids = [upload(client, chat, name, data).json()["id"] for name, data in (
        ("notes.md", b"# Notes\n\nThe boat leaves at nine."),
        ("letter.docx", files.docx(["Dear council,", "the road is mended."])),
        ("page.html", files.html("The festival is in July.")))]
    _, reply = send(client, f"/api/chats/{chat}/messages", {"content": "Summarise these.", "attachments": ids})
    prompt = asked_text(recorder)
    for name, fact in (("notes.md", "The boat leaves at nine."), ("letter.docx", "the road is mended."),
                       ("page.html", "The festival is in July.")):
        assert f'<file name="{name}">' in prompt and fact in prompt
    assert [(s["file"], s["whole"]) for s in reply["sources"]] == [("notes.md", True), ("letter.docx", True),
                                                                    ("page.html", True)]


def test_each_bad_file_is_a_4xx_naming_what_to_fix(client):
    chat = new_chat(client)
    big = upload(client, chat, "big.txt", b"a" * (MAX_FILE_BYTES + 1))
    assert big.status_code == 413 and str(MAX_FILE_BYTES) in big.json()["error"]["message"]
    video = upload(client, chat, "clip.mp4", b"\0\0\0\x18ftypmp42" + b"\0" * 100)
    assert video.status_code == 415 and "PDF" in video.json()["error"]["message"]
    png = upload(client, chat, "photo.png", b"\x89PNG\r\n\x1a\n" + b"\0" * 100)  # kept as an image, if it were one
    assert png.status_code == 400 and "not an image" in png.json()["error"]["message"]
    locked = upload(client, chat, "secret.pdf", files.encrypted_pdf())
    assert locked.status_code == 422 and "encrypted" in locked.json()["error"]["message"]
    pages = upload(client, chat, "empty.pdf", files.empty_pages_pdf())
    assert pages.status_code == 413 and "the limit is 500 pages" in pages.json()["error"]["message"]
    bomb = upload(client, chat, "bomb.docx", files.zip_bomb_docx())
    assert bomb.status_code == 422 and "unpacks to" in bomb.json()["error"]["message"]
    one = upload(client, chat, "a.txt", b"hello").json()["id"]
    many = client.post(f"/api/chats/{chat}/messages", json={"content": "hi",
                                                            "attachments": [one] * (MAX_FILES_PER_MESSAGE + 1)})
    assert many.status_code == 400 and str(MAX_FILES_PER_MESSAGE) in many.json()["error"]["message"]
    assert client.get(f"/api/chats/{chat}/files").json()["data"][0]["id"] == one


def test_a_file_of_another_chat_or_no_chat_is_not_found(client):
    first, second = new_chat(client), new_chat(client)
    theirs = upload(client, first, "a.txt", b"hello").json()["id"]
    wrong = client.post(f"/api/chats/{second}/messages", json={"content": "hi", "attachments": [theirs]})
    assert wrong.status_code == 404 and wrong.json()["error"]["code"] == "document_not_found"
    made_up = client.post(f"/api/chats/{second}/messages", json={"content": "hi", "attachments": ["0" * 32]})
    assert made_up.status_code == 404
    assert upload(client, "f" * 32, "a.txt", b"hello").status_code == 404


def test_a_chats_files_go_with_it(client, data_dir):
    chat = new_chat(client)
    upload(client, chat, "gone.txt", b"only this chat has these bytes")
    digest = hashlib.sha256(b"only this chat has these bytes").hexdigest()
    assert (data_dir / "files" / digest[:2] / digest).exists()
    assert client.delete(f"/api/chats/{chat}").status_code == 204
    assert not (data_dir / "files" / digest[:2] / digest).exists()
