"""The Responses API's store on SQLite, and on PostgreSQL when SERGE_TEST_POSTGRES_URL names one (CI)."""

from __future__ import annotations

import pytest

from serge.store import ResponseNotFound, ResponseStore


@pytest.fixture
def store(database):
    return ResponseStore(database)


def _add(store: ResponseStore, owner: str, response_id: str, previous: str | None = None, text: str = "hi"):
    return store.add(owner, id=response_id, model="m", status="completed", previous_response_id=previous,
                     input_items=[{"type": "message", "id": f"msg_{response_id}", "role": "user", "status": "completed",
                                   "content": [{"type": "input_text", "text": text}]}],
                     output_items=[{"type": "function_call", "id": f"fc_{response_id}", "call_id": "call_1",
                                    "name": "f", "arguments": "{}", "status": "completed"}],
                     usage={"input_tokens": 3}, request={"instructions": None, "store": True})


def test_a_stored_response_comes_back_as_it_went_in(store):
    made = _add(store, "me", "resp_1", text="héllo")
    got = store.get("me", "resp_1")
    assert got == made and got.input_items[0]["content"][0]["text"] == "héllo"
    assert got.output_items[0]["call_id"] == "call_1" and got.usage == {"input_tokens": 3}


def test_another_owners_response_is_not_found_and_cannot_be_deleted(store):
    _add(store, "me", "resp_1")
    with pytest.raises(ResponseNotFound):
        store.get("you", "resp_1")
    with pytest.raises(ResponseNotFound) as caught:
        store.chain("you", "resp_1")
    assert caught.value.param == "previous_response_id"
    with pytest.raises(ResponseNotFound):
        store.delete("you", "resp_1")
    assert store.get("me", "resp_1").id == "resp_1" and store.ids("you") == []


def test_a_chain_comes_oldest_first_and_ends_where_a_link_is_gone(store):
    _add(store, "me", "resp_1")
    _add(store, "me", "resp_2", "resp_1")
    _add(store, "me", "resp_3", "resp_2")
    assert [r.id for r in store.chain("me", "resp_3")] == ["resp_1", "resp_2", "resp_3"]
    store.delete("me", "resp_1")
    assert [r.id for r in store.chain("me", "resp_3")] == ["resp_2", "resp_3"]
    _add(store, "you", "resp_x", "resp_3")  # another owner's link into my chain reads nothing of mine
    assert [r.id for r in store.chain("you", "resp_x")] == ["resp_x"]
    with pytest.raises(ResponseNotFound):
        store.delete("me", "resp_1")
