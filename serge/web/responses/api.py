"""OpenAI's Responses API: `POST /v1/responses`, and stored responses' `GET`, `DELETE` and `input_items`.

HTTP only: it reads the request (`responses.models`), continues a stored chain
(`previous_response_id`: what comes before the new input is `chats.responses`'
rule), asks the engine
for a stream and answers a `response` object, or its typed server-sent events
(`responses.output`). A response is stored, owned by the account that made it, once
it has finished (`store: false` keeps nothing); one whose client went away is
cancelled and not stored at all, so nothing half-made is ever kept.
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool

from serge.engine import ChatRequest, Engine, Stream
from serge.chats.responses import StoredResponses
from serge.store import ResponseNotFound, ResponseRecord
from serge.web.http.auth import owner
from serge.web.http.context import RouteKind, services
from serge.web.pages.docs import BUSY
from serge.web.http.errors import ApiError
from serge.web.http.dialects import start_chat
from serge.web.http.request_log import note_generation, note_tools_left_out
from serge.web.responses.items import conversation
from serge.web.responses.answer import answer, started
from serge.web.responses.mcp_api import mcp_response
from serge.web.responses.models import HARMLESS, HOSTED, CreateResponse
from serge.web.responses.output import (DeletedResponse, InputItemList, OutputItems, ResponseOut, response_object)

router = APIRouter(prefix="/v1", tags=["OpenAI Responses API"])
GENERATES = RouteKind("responses", model=True, streaming=True).depends  # a route that runs a model and may stream its reply

CREATE_DOC = f"""OpenAI's Responses API. `input` is a string or a list of items: messages (roles user,
assistant, system, developer; parts input_text, output_text), function_call and function_call_output
items, reasoning items (accepted and left out of the prompt, as thinking templates leave earlier
thoughts out), and the MCP items (mcp_approval_response; mcp_list_tools, mcp_call and mcp_approval_request
as a client sends them back). Images and files are a 400.

A model that thinks (its template knows `<think>`) answers with a `reasoning` item before its message:
`summary` empty, its thoughts whole in `content` as one `reasoning_text` part, and their tokens in
usage.output_tokens_details.reasoning_tokens. reasoning.effort none or minimal asks its template not to
think, where the template allows.

Function tools are offered as the Responses API spells them (flat: type, name, description,
parameters, strict). OpenAI's `mcp` tool names an MCP server registered in Serge (`server_label`; a
`server_url` must be the registered one, and headers or tokens are refused): Serge lists its tools (an
`mcp_list_tools` item, once per conversation), runs the calls the model makes (`mcp_call` items with
`output` or `error`, then the model goes on, up to SERGE_TOOL_STEPS calls), and ends the response with an
`mcp_approval_request` item for a call that needs approval (require_approval: always, the default, never,
or {{always, never}} filters by tool_names and read_only); answer it with an `mcp_approval_response` input
item. Hosted tools ({", ".join(HOSTED)}, and any other type but function and mcp) are left out of what the
model is offered, never refused, and named in the request log (`tools_left_out=`). tool_choice required, a
named function, or {{type: mcp, server_label, name}}, and text.format json_schema / json_object are enforced
by constrained decoding.

`store` (default true) keeps the response, owned by your account, for GET, input_items and
previous_response_id; a streamed response is stored when it has finished, just before
response.completed, and not at all if the client goes away first (its generation is cancelled).
truncation disabled (the default) answers a conversation that does not fit the model's window with a 400
naming the token counts; auto leaves out its oldest turns. Accepted without effect: {", ".join(HARMLESS)}.
With `stream: true`: server-sent events response.created, response.in_progress, then for each output item
response.output_item.added, (response.content_part.added, response.reasoning_text.delta...,
response.reasoning_text.done, response.content_part.done) for a reasoning item, (response.content_part.added,
response.output_text.delta..., response.output_text.done, response.content_part.done) for a message, or
(response.function_call_arguments.delta..., response.function_call_arguments.done) for a call,
(response.mcp_list_tools.in_progress, response.mcp_list_tools.completed or .failed) for a listing,
(response.mcp_call.in_progress, response.mcp_call_arguments.delta..., response.mcp_call_arguments.done,
response.mcp_call.completed or .failed) for a call Serge runs, response.output_item.done; then
response.completed or response.incomplete; `error` if generation fails on the way. Every event has a rising sequence_number."""

_STREAMED = {200: {"model": ResponseOut, "description": "A response, or its events when streamed.",
                   "content": {"text/event-stream": {"schema": {"type": "object", "required": ["event", "data"],
                                                                "properties": {"event": {"type": "string"},
                                                                               "data": {"type": "string"}}}}}},
             503: BUSY}


def _engine(request: Request) -> Engine:
    return request.app.state.engine


def _store(request: Request) -> StoredResponses:
    return services(request).responses


async def history_of(body: CreateResponse, request: Request, user: str) -> list[dict]:
    """What a reply continuing `previous_response_id` comes after (chats.responses' rule); none without one."""
    if not body.previous_response_id:
        return []
    try:
        return await run_in_threadpool(_store(request).history, user, body.previous_response_id)
    except ResponseNotFound as exc:
        raise ApiError(404, f"previous_response_id: {exc}", code="previous_response_not_found",
                       param="previous_response_id") from None


async def _start(body: CreateResponse, request: Request, user: str) -> tuple[Stream, list[dict]]:
    """The stream of the reply, and this request's input items as they will be stored."""
    history: list[dict] = []
    if body.previous_response_id:
        try:
            history = await run_in_threadpool(_store(request).history, user, body.previous_response_id)
        except ResponseNotFound as exc:
            raise ApiError(404, f"previous_response_id: {exc}", code="previous_response_not_found",
                           param="previous_response_id") from None
    items = await run_in_threadpool(body.input_items)  # its files and images are read off the event loop
    messages = await run_in_threadpool(conversation, body.instructions, history + items)
    if not any(m.role != "system" for m in messages):
        raise ApiError(400, "input has no message or function call output to answer", code="invalid_value",
                       param="input")
    tools, response_format, params = body.tool_offer(), body.response_format(), body.sampling()
    note_tools_left_out(request, body.left_out())
    ask = ChatRequest(messages, params, tools, response_format, trim=body.truncation == "auto", think=body.think())
    stream = await started(lambda: start_chat(request, body.model, ask))
    note_generation(request, stream.model, stream)
    return stream, items


@router.post("/responses", summary="Create a response (streamed or not)", description=CREATE_DOC,
             responses=_STREAMED, dependencies=[GENERATES])
async def create_response(body: CreateResponse, request: Request):
    user = owner(request)
    if body.uses_mcp():  # Serge runs the calls of registered MCP servers' tools between passes
        return await mcp_response(body, request, await history_of(body, request, user))
    stream, items = await _start(body, request, user)
    builder = OutputItems(body.wants_logprobs)

    async def events():
        async for delta in stream.adeltas():
            for event in builder.add(delta):
                yield event

    return await answer(body, request, owner=user, model=stream.model, items=items, builder=builder,
                        events=events, record=lambda: stream.record, reply=stream)


def _stored(record: ResponseRecord) -> dict:
    return response_object(record.id, int(record.created_at.timestamp()), record.model, record.status,
                           list(record.output_items), record.usage, record.request, record.previous_response_id)


async def _get(request: Request, response_id: str) -> ResponseRecord:
    return await run_in_threadpool(_store(request).get, owner(request), response_id)  # ResponseNotFound: a 404


@router.get("/responses/{response_id}", summary="A stored response (404 for another account's)",
            responses={200: {"model": ResponseOut}})
async def get_response(response_id: str, request: Request):
    return _stored(await _get(request, response_id))


@router.delete("/responses/{response_id}", summary="Delete a stored response",
               responses={200: {"model": DeletedResponse}})
async def delete_response(response_id: str, request: Request):
    await run_in_threadpool(_store(request).delete, owner(request), response_id)
    return {"id": response_id, "object": "response", "deleted": True}


@router.get("/responses/{response_id}/input_items", summary="A stored response's input items, a page at a time",
            responses={200: {"model": InputItemList}})
async def list_input_items(request: Request, response_id: str, limit: int = Query(20, ge=1, le=100),
                           order: Literal["asc", "desc"] = "desc",
                           after: str | None = Query(None, max_length=256, description="An item id: the page "
                                                                                       "starts after it."),
                           include: list[str] | None = Query(None, max_length=32, description="Without effect.")):
    items = list((await _get(request, response_id)).input_items)
    if order == "desc":
        items.reverse()
    if after is not None:
        ids = [i.get("id") for i in items]
        if after not in ids:
            raise ApiError(400, f"after: no input item {after!r} in this response", code="invalid_value",
                           param="after")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}
