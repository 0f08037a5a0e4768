"""Knowledge collections through the API, on a real server over the stand-in model and a stand-in embedder: a
collection is made once, its files indexed in the background, and used from any chat of its account (by the
chat's settings or by one message), its passages fused with the chat's own files; another account's is a 404."""

from __future__ import annotations

from contextlib import closing

import httpx
import pytest

import documents as files
from conftest import own_server
from test_accounts_api import add_user, login
from test_chat_documents import QUESTION, asked_text, documents_engine, new_chat, recorder, upload  # noqa: F401
from test_chats_api import send, wait_for

from serge.documents import MAX_FILE_BYTES


@pytest.fixture(scope="module")
def engine(standin_settings, recorder):
    with documents_engine(standin_settings, recorder) as running:
        yield running


@pytest.fixture(scope="module")
def client(engine, tmp_path_factory):
    settings, running = engine
    with own_server(settings, running, tmp_path_factory.mktemp("knowledge-data")) as url, \
            httpx.Client(base_url=url, timeout=120) as http:
        yield http


def make(client, name: str) -> dict:
    made = client.post("/api/knowledge", json={"name": name})
    assert made.status_code == 201, made.text
    return made.json()


def put(client, collection_id: str, name: str, data: bytes) -> httpx.Response:
    return client.post(f"/api/knowledge/{collection_id}/files", files={"file": (name, data, "application/pdf")})


def indexed(client, collection_id: str) -> dict:
    """The collection once no file of it waits."""
    return wait_for(lambda: (c := client.get(f"/api/knowledge/{collection_id}").json())["state"] == "ready" and c,
                    what="the collection to be indexed")


def test_a_fact_on_page_three_reaches_a_second_chat_through_a_collection(client, recorder):
    harbour = make(client, "harbour")
    assert harbour["files"] == 0 and harbour["state"] == "ready"
    uploaded = put(client, harbour["id"], "minutes.pdf", files.long_report_pdf())
    assert uploaded.status_code == 201, uploaded.text
    assert uploaded.json()["state"] in ("queued", "indexing", "indexed")
    done = indexed(client, harbour["id"])
    [file] = done["data"]
    assert file["state"] == "indexed" and file["pages"] == 12 and file["passages"] == file["passages_total"] > 0
    assert done["files_indexed"] == done["files"] == 1 and done["passages"] == file["passages"]

    # a message names it (the page's `#harbour`) in a chat that never saw the file
    first = new_chat(client)
    _, reply = send(client, f"/api/chats/{first}/messages", {"content": QUESTION, "knowledge": ["harbour"]})
    assert files.PAGE_THREE_FACT in " ".join(asked_text(recorder).split())
    top = reply["sources"][0]
    assert (top["file"], top["page"], top["collection"]) == ("minutes.pdf", 3, "harbour")
    assert "Ottoline" in top["passage"].replace("\n", " ") and top["word_rank"] == 1
    assert client.get(f"/api/chats/{first}").json()["messages"][0]["knowledge"] == [harbour["id"]]

    # a second chat names it in its settings: every reply searches it, beside the chat's own file
    second = client.post("/api/chats", json={"knowledge": [harbour["id"]], "settings": {"max_new_tokens": 4}}).json()
    assert second["knowledge"] == [harbour["id"]]
    own = upload(client, second["id"], "notes.md", b"# Notes\n\nThe ferry to Skerry Island leaves at nine.").json()
    _, reply = send(client, f"/api/chats/{second['id']}/messages", {"content": QUESTION, "attachments": [own["id"]]})
    assert files.PAGE_THREE_FACT in " ".join(asked_text(recorder).split())
    by_file = {(s["file"], s["collection"]) for s in reply["sources"]}
    assert ("minutes.pdf", "harbour") in by_file and ("notes.md", None) in by_file  # one fusion over both
    assert reply["sources"][0]["page"] == 3


def test_a_collections_name_can_change_and_a_deleted_one_is_searched_no_more(client, recorder):
    tides = make(client, "tides")
    put(client, tides["id"], "tides.md", b"# Tides\n\nHigh water at Skerry Island is at noon on Sundays.")
    indexed(client, tides["id"])
    renamed = client.patch(f"/api/knowledge/{tides['id']}", json={"name": "tide-tables"})
    assert renamed.status_code == 200 and renamed.json()["name"] == "tide-tables"
    chat = client.post("/api/chats", json={"knowledge": ["tide-tables"], "settings": {"max_new_tokens": 4}}).json()
    _, reply = send(client, f"/api/chats/{chat['id']}/messages", {"content": "When is high water on Skerry?"})
    assert reply["sources"][0]["collection"] == "tide-tables" and "noon" in asked_text(recorder)
    assert client.delete(f"/api/knowledge/{tides['id']}").status_code == 204
    assert client.get(f"/api/knowledge/{tides['id']}").status_code == 404
    _, after = send(client, f"/api/chats/{chat['id']}/messages", {"content": "When is high water on Skerry?"})
    assert not after["sources"] and "noon" not in asked_text(recorder)
    kept = client.get(f"/api/chats/{chat['id']}").json()["messages"][1]
    assert kept["sources"] == reply["sources"]  # what a reply was given stays with it


def test_files_are_listed_deleted_and_reindexed(client):
    notes = make(client, "notes")
    one = put(client, notes["id"], "a.md", b"alpha beta gamma").json()
    put(client, notes["id"], "b.md", b"delta epsilon")
    indexed(client, notes["id"])
    assert client.delete(f"/api/knowledge/{notes['id']}/files/{one['id']}").status_code == 204
    assert [f["name"] for f in client.get(f"/api/knowledge/{notes['id']}/files").json()["data"]] == ["b.md"]
    assert client.post(f"/api/knowledge/{notes['id']}/reindex").json() == {"queued": 1}
    again = indexed(client, notes["id"])
    assert again["files_indexed"] == 1 and again["data"][0]["passages"] == 1
    assert client.delete(f"/api/knowledge/{notes['id']}/files/{one['id']}").status_code == 404


def test_each_bad_request_is_a_4xx_naming_what_to_fix(client):
    spaced = client.post("/api/knowledge", json={"name": "my notes"})
    assert spaced.status_code == 400 and "no spaces" in spaced.json()["error"]["message"]
    make(client, "twice")
    taken = client.post("/api/knowledge", json={"name": "twice"})
    assert taken.status_code == 409 and taken.json()["error"]["code"] == "collection_exists"
    box = make(client, "box")
    png = client.post(f"/api/knowledge/{box['id']}/files", files={"file": ("p.png", b"\x89PNG\r\n\x1a\n" + b"\0" * 9)})
    assert png.status_code == 415 and "PDF" in png.json()["error"]["message"]
    big = put(client, box["id"], "big.txt", b"a" * (MAX_FILE_BYTES + 1))
    assert big.status_code == 413 and str(MAX_FILE_BYTES) in big.json()["error"]["message"]
    locked = put(client, box["id"], "secret.pdf", files.encrypted_pdf())
    assert locked.status_code == 201  # read in the background: the file says why it could not be
    failed = wait_for(lambda: (f := client.get(f"/api/knowledge/{box['id']}/files").json()["data"][0])["state"]
                      != "queued" and f["state"] != "indexing" and f, what="the reader")
    assert failed["state"] == "failed" and "encrypted" in failed["error"]
    chat = new_chat(client)
    unknown = client.post(f"/api/chats/{chat}/messages", json={"content": "hi", "knowledge": ["nowhere"]})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "collection_not_found"
    assert "nowhere" in unknown.json()["error"]["message"]
    many = client.post(f"/api/chats/{chat}/messages", json={"content": "hi", "knowledge": ["box"] * 9})
    assert many.status_code == 400


def test_another_accounts_collection_is_not_found(engine, tmp_path_factory):
    settings, running = engine
    data_dir = tmp_path_factory.mktemp("knowledge-accounts")
    with own_server(settings, running, data_dir) as url:
        add_user(data_dir, "alice")
        add_user(data_dir, "bob")
        with closing(login(url, "alice")) as alice, closing(login(url, "bob")) as bob:
            hers = make(alice, "private")
            put(alice, hers["id"], "diary.md", b"The key is under the third stone.")
            indexed(alice, hers["id"])
            assert [c["name"] for c in bob.get("/api/knowledge").json()["data"]] == []
            for method, path, body in (("GET", "", None), ("GET", "/files", None), ("PATCH", "", {"name": "mine"}),
                                       ("POST", "/reindex", None), ("POST", "/cancel", None), ("DELETE", "", None)):
                answer = bob.request(method, f"/api/knowledge/{hers['id']}{path}", json=body)
                assert answer.status_code == 404, (method, path, answer.text)
            assert put(bob, hers["id"], "x.md", b"x").status_code == 404
            chat = new_chat(bob)
            by_id = bob.post(f"/api/chats/{chat}/messages", json={"content": "key?", "knowledge": [hers["id"]]})
            by_name = bob.post(f"/api/chats/{chat}/messages", json={"content": "key?", "knowledge": ["private"]})
            assert by_id.status_code == by_name.status_code == 404
            assert bob.post("/api/chats", json={"knowledge": [hers["id"]]}).status_code == 404
            assert alice.get(f"/api/knowledge/{hers['id']}").json()["files_indexed"] == 1
