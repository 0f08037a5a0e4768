"""The Responses API's stored conversations: what a `previous_response_id` continues, and keeping a finished reply.

A stored response is a turn of a conversation its `previous_response_id`s chain together;
continuing one puts the chain's items (each response's input, then its output, oldest first)
before the new input, so the model sees the conversation and the prefix cache finds what it
already has. Every operation is owner-scoped: another account's response is not found.
What the items say (their JSON shape, turning them into messages) is the Responses dialect's
(`web.responses.items`); where they are kept is the store's. No HTTP here.
"""

from __future__ import annotations

from datetime import datetime

from serge.store import ResponseRecord, ResponseStore


class StoredResponses:
    def __init__(self, store: ResponseStore) -> None:
        self._store = store

    def history(self, owner: str, previous_response_id: str) -> list[dict]:
        """The items a reply continuing `previous_response_id` comes after, oldest first; a deleted link ends
        the chain there. ResponseNotFound (naming previous_response_id) when that response is not `owner`'s."""
        chain = self._store.chain(owner, previous_response_id)
        return [item for response in chain for item in (*response.input_items, *response.output_items)]

    def keep(self, owner: str, *, id: str, model: str, status: str, previous_response_id: str | None,
             input_items: list[dict], output_items: list[dict], usage: dict, request: dict,
             created_at: datetime) -> ResponseRecord:
        """Store a finished response, whole (nothing half-made is ever kept)."""
        return self._store.add(owner, id=id, model=model, status=status, previous_response_id=previous_response_id,
                               input_items=input_items, output_items=output_items, usage=usage, request=request,
                               created_at=created_at)

    def get(self, owner: str, response_id: str) -> ResponseRecord:
        return self._store.get(owner, response_id)

    def delete(self, owner: str, response_id: str) -> None:
        self._store.delete(owner, response_id)
