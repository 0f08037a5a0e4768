"""The documents store on SQLite, and on PostgreSQL when SERGE_TEST_POSTGRES_URL names one (CI): files kept once
by their hash, owned by their account, gone with their chat; passages ranked by meaning and by words."""

from __future__ import annotations

import numpy as np
import pytest

from serge.store import ChatStore, DocumentNotFound, DocumentStore, FileStore, NewChunk


@pytest.fixture
def stores(database, tmp_path):
    return ChatStore(database), DocumentStore(database, FileStore(tmp_path / "files"))


def _vector(*hot: int) -> np.ndarray:
    v = np.zeros(8, dtype=np.float32)
    v[list(hot)] = 1.0
    return v


def _add(docs: DocumentStore, owner: str, chat_id: str, data: bytes = b"bytes", name: str = "a.txt"):
    chunks = [NewChunk(1, "the ferry timetable for winter", _vector(0)),
              NewChunk(2, "the lighthouse keeper lives on the island", _vector(1)),
              NewChunk(3, "tide tables are printed each spring", _vector(2))]
    return docs.add(owner, chat_id, name=name, media_type="text/plain", data=data, pages=["p1", "p2", "p3"],
                    chunks=chunks)


def test_a_file_is_kept_once_by_its_hash_and_read_back(stores, tmp_path):
    chats, docs = stores
    chat = chats.create_chat("me", title="t")
    one, two = _add(docs, "me", chat.id), _add(docs, "me", chat.id)
    assert one.id != two.id and one.sha256 == two.sha256
    assert [p.name for p in (tmp_path / "files").rglob("*") if p.is_file()] == [one.sha256]
    assert docs.read("me", one.id) == b"bytes" and docs.get("me", one.id).pages == ("p1", "p2", "p3")
    assert oct(docs.files.path(one.sha256).stat().st_mode & 0o777) == "0o600"


def test_another_accounts_document_is_not_found(stores):
    chats, docs = stores
    chat = chats.create_chat("me", title="t")
    mine = _add(docs, "me", chat.id)
    with pytest.raises(DocumentNotFound):
        docs.get("you", mine.id)
    assert docs.list("you", chat.id) == []
    assert docs.by_words("you", [mine.id], ["lighthouse"], 5) == []
    assert docs.by_meaning("you", [mine.id], _vector(1), 5) == []


def test_a_chats_documents_go_with_it_and_shared_bytes_stay_while_used(stores, tmp_path):
    chats, docs = stores
    first, second = chats.create_chat("me", title="1"), chats.create_chat("me", title="2")
    a = _add(docs, "me", first.id)
    b = _add(docs, "me", second.id)
    only = _add(docs, "me", first.id, data=b"only in the first", name="only.txt")
    docs.delete_chat("me", first.id)
    chats.delete_chat("me", first.id)
    with pytest.raises(DocumentNotFound):
        docs.get("me", a.id)
    assert not docs.files.path(only.sha256).exists() and docs.read("me", b.id) == b"bytes"
    assert [h.document_id for h in docs.by_words("me", [a.id, b.id], ["lighthouse"], 5)] == [b.id]


def test_passages_are_ranked_by_meaning_and_by_words(stores):
    chats, docs = stores
    doc = _add(docs, "me", chats.create_chat("me", title="t").id)
    near = docs.by_meaning("me", [doc.id], _vector(1) + 0.1 * _vector(2), 3)
    assert [h.page for h in near] == [2, 3, 1] and near[0].score > near[1].score
    worded = docs.by_words("me", [doc.id], ["keeps", "lighthouse"], 3)
    assert worded[0].page == 2 and "lighthouse" in worded[0].text
    assert docs.by_words("me", [doc.id], ['"', "OR", "bm25(", "; DROP"], 3) == []  # no query syntax from the user
