"""`POST /v1/responses` with `mcp` tools: the HTTP side of a reply whose calls of MCP tools Serge runs.

`create_response` (api.py) hands a request here when it offers an `mcp` tool or answers an
approval request. This reads the request into the service's values (which servers, which tools,
which approvals: responses.mcp), lists the servers' tools before answering (so a refused server,
a bad `server_url` or a name clash is a 4xx, never a broken stream), and turns the turn's events
(serge.chats.mcp_turn, which runs the calls) into OpenAI's items and events (responses.mcp_output),
whole or streamed. The response is stored as any other, with its MCP items, so a continued
conversation (`previous_response_id`) neither lists a server again nor loses a call's output.
"""

from __future__ import annotations


from fastapi import Request
from starlette.concurrency import run_in_threadpool

from serge.chats.mcp_turn import (ApprovalAsked, CallDone, CallRunning, Generated, McpTurn, PassStarted, ToolNameClash,
                                  TurnEnded, as_function, catalog, list_tools)
from serge.engine import ChatRequest, ContextTooLong, GenerationRecord
from serge.web.http.auth import current_user
from serge.web.http.errors import ApiError
from serge.web.http.request_log import note_generation, note_tools_left_out
from serge.web.responses.items import conversation, invalid
from serge.web.responses.answer import answer, too_long
from serge.web.responses.mcp import approvals, checked_uses, earlier_listings
from serge.web.responses.mcp_output import McpOutputItems
from serge.web.responses.models import CreateResponse


async def mcp_response(body: CreateResponse, request: Request, history: list[dict]):
    user = current_user(request)
    servers = getattr(request.app.state, "tools", None)
    uses = await run_in_threadpool(checked_uses, body.mcp_tools(), servers, user)  # it reads the registry
    items = await run_in_threadpool(body.input_items)
    listings = await list_tools(servers, uses, earlier_listings(history + items)) if uses else []
    try:
        tools = catalog(uses, listings, [f.name for f in body.functions()])
    except ToolNameClash as exc:
        raise invalid(str(exc), "tools") from None
    answers = approvals(history, items)
    if unknown := [a.call.name for a in answers if a.approve and a.call.name not in tools]:
        raise invalid(f"input approves a call of {unknown[0]!r}, which none of the mcp tools offers; send the "
                      "same mcp tool as the request that asked", "tools")
    settings = request.app.state.settings
    turn = McpTurn(request.app.state.engine, servers, tools, settings.tool_steps)
    builder = McpOutputItems(body.wants_logprobs, tools)
    first = [event for listing in listings if listing.fresh for event in builder.listed(listing)]
    made = 0
    async for event in turn.approved(answers):  # before the model goes on: their outputs are in its prompt
        if isinstance(event, CallRunning):
            first += builder.running(event)
        else:
            made += 1
            first += builder.called(event)
    ran = [i for i in builder.output if i["type"] == "mcp_call"]
    messages = await run_in_threadpool(conversation, body.instructions, history + items + ran)
    if not any(m.role != "system" for m in messages):
        raise ApiError(400, "input has no message or function call output to answer", code="invalid_value",
                       param="input")
    offer = body.tool_offer({name: t.use.server for name, t in tools.items()},
                            tuple(as_function(t) for t in tools.values()))
    if offer is not None and made >= settings.tool_steps:
        offer = turn.tools_after(offer, made)
    note_tools_left_out(request, body.left_out())
    ask = ChatRequest(messages, body.sampling(), offer, body.response_format(), trim=body.truncation == "auto",
                      think=body.think())
    try:
        stream = await run_in_threadpool(turn.start, body.model, ask)
    except ContextTooLong as exc:
        raise too_long(exc) from None
    note_generation(request, stream.model, stream)
    ended: list[GenerationRecord] = []

    async def events():
        """OpenAI's events for the turn; its last record in `ended`."""
        for event in first:
            yield event
        async for event in turn.run(ask, made):
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

    return await answer(body, request, owner=user.id, model=stream.model, items=items, builder=builder,
                        events=events, record=lambda: ended[-1], reply=turn)
