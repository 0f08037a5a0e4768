"""`POST /v1/responses` with `mcp` tools: the HTTP side of a reply whose calls of MCP tools Serge runs.

`create_response` (api.py) hands a request here when it offers an `mcp` tool or answers an
approval request. This reads the request into the turn's values (which servers, which tools,
which approvals: responses.mcp), lists the servers' tools before answering (so a refused server,
a bad `server_url` or a name clash is a 4xx, never a broken stream), runs the one tool turn the
chat page runs too (serge.chats.tools, with the client's approvals), and turns its events into
OpenAI's items and events (responses.mcp_output), whole or streamed. The response is stored as any
other, with its MCP items, so a continued conversation (`previous_response_id`) neither lists a
server again nor loses a call's output.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from fastapi import Request
from starlette.concurrency import run_in_threadpool

from serge.chats.tools import (AlreadyAnswered, ApprovalAsked, CallDone, CallRunning, Generated, PassStarted,
                               ToolNameClash, ToolTurn, TurnEnded, catalog, list_tools, run_approved)
from serge.engine import ChatRequest, GenerationRecord
from serge.web.http.auth import current_user
from serge.web.http.dialects import start_chat
from serge.web.http.errors import ApiError
from serge.web.http.request_log import note_generation, note_tools_left_out
from serge.web.responses.answer import answer, started
from serge.web.responses.items import conversation, invalid
from serge.web.responses.mcp import approvals, checked_uses, earlier_listings
from serge.web.responses.mcp_output import McpOutputItems
from serge.web.http.context import services
from serge.web.responses.models import CreateResponse

_END = object()


async def in_thread(events: Iterator) -> AsyncIterator:
    """A blocking generator read on the server's thread pool, one item at a time, and closed there (its `finally`
    waits for the engine's worker) when the reader stops early."""
    try:
        while (event := await run_in_threadpool(next, events, _END)) is not _END:
            yield event
    finally:
        await run_in_threadpool(events.close)


async def mcp_response(body: CreateResponse, request: Request, history: list[dict]):
    user = current_user(request)
    servers = services(request).tools
    uses = await run_in_threadpool(checked_uses, body.mcp_tools(), servers, user)  # it reads the registry
    items = await run_in_threadpool(body.input_items)
    listings = await list_tools(servers, uses, earlier_listings(history + items)) if uses else []
    functions = [f.name for f in body.functions()]
    try:
        tools = catalog(uses, listings, functions)
    except ToolNameClash as exc:
        raise invalid(str(exc), "tools") from None
    answers = approvals(history, items)
    if unknown := [a.call.name for a in answers if a.approve and a.call.name not in tools]:
        raise invalid(f"input approves a call of {unknown[0]!r}, which none of the mcp tools offers; send the "
                      "same mcp tool as the request that asked", "tools")
    decisions = services(request).decisions

    def run(spec, arguments):
        return servers.submit(servers.call(spec.server, spec.name, arguments))

    builder = McpOutputItems(body.wants_logprobs, tools)
    first = [event for listing in listings if listing.fresh for event in builder.listed(listing)]

    def approved() -> list:  # before the model goes on: their outputs are in its prompt
        return list(run_approved(answers, tools, run, lambda id, allow: decisions.take(user.id, id, allow)))

    try:
        ran = await run_in_threadpool(approved)
    except AlreadyAnswered as exc:
        raise ApiError(409, f"input: {exc}", code="approval_already_answered", param="input") from None
    for event in ran:
        first += builder.running(event) if isinstance(event, CallRunning) else builder.called(event)
    made = sum(isinstance(event, CallDone) for event in ran)
    outputs = [i for i in builder.output if i["type"] == "mcp_call"]
    messages = await run_in_threadpool(conversation, body.instructions, history + items + outputs)
    if not any(m.role != "system" for m in messages):
        raise ApiError(400, "input has no message or function call output to answer", code="invalid_value",
                       param="input")
    offer = body.tool_offer({name: t.server for name, t in tools.items()},
                            tuple(t.as_function(name) for name, t in tools.items()))
    note_tools_left_out(request, body.left_out())
    ask = ChatRequest(messages, body.sampling(), offer, body.response_format(), trim=body.truncation == "auto",
                      think=body.think())
    steps = request.app.state.settings.tool_steps

    def start(pass_ask: ChatRequest):  # each pass's budget held; the turn, noted whole, reports their tokens
        return start_chat(request, body.model, pass_ask, counted=False)

    turn = await started(lambda: ToolTurn(start, ask, tools, run, decisions.client(user.id), steps=steps,
                                          functions=frozenset(functions), made=made))
    note_generation(request, turn.model, turn)  # every pass is metered: the turn's record sums them
    ended: list[GenerationRecord] = []

    async def events():
        """OpenAI's events for the turn; its last record in `ended`."""
        for event in first:
            yield event
        async for event in in_thread(turn.events()):
            if isinstance(event, PassStarted):
                for out in builder.next_pass():
                    yield out
            elif isinstance(event, Generated):
                for out in builder.add(event.delta):
                    yield out
            elif isinstance(event, CallRunning):
                for out in builder.running(event):
                    yield out
            elif isinstance(event, CallDone):
                for out in builder.called(event):
                    yield out
            elif isinstance(event, ApprovalAsked):
                for out in builder.asked(event.call):
                    yield out
            elif isinstance(event, TurnEnded):
                ended.append(event.record)

    def record() -> GenerationRecord:
        return ended[-1] if ended else turn.record

    return await answer(body, request, owner=user.id, model=turn.model, items=items, builder=builder,
                        events=events, record=record, reply=turn)
