"""`/mcp`: Serge's own knowledge offered over MCP (streamable HTTP) to agents such as Claude Code or Codex.

The protocol is the official `mcp` SDK's (`MCPServer` and its streamable-HTTP app), stateless and answering
in JSON: each POST stands alone, so any Serge process behind a load balancer can answer it and no session
lives in one process's memory. It is a route like any other: the Host, Origin and body checks and the
`Authenticate` middleware have run before it, so the user is already known (an API key as `Authorization:
Bearer sk-serge-...`, or the local user while Serge has no accounts) and every tool passes that user's id as
the owner to `serge.chats.lookup.Lookup`. The SDK's own DNS-rebinding check is off because Serge's guard
(SERGE_ALLOWED_HOSTS) already made that decision for every route. A tool's refusal (an unknown collection,
an empty query, a quota used up) is a tool error the agent reads, never an HTTP 500. A search that embeds
its query is a model request of its user, admitted, reserved and counted as every dialect's
(`serge.accounts.reservations`). It holds no business rules of its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Annotated, TypeVar

from fastapi import FastAPI
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import ToolAnnotations
from pydantic import Field
from starlette.requests import Request

from serge import __version__
from serge.accounts import LOCAL_USER, QuotaExceeded
from serge.chats import ChatNotFound, InvalidChatInput, InvalidCollectionInput
from serge.chats.lookup import MAX_PASSAGES, ChatSummary, ChatText, CollectionSummary, Lookup, Passage
from serge.store import CollectionNotFound
from serge.web.http.context import context as request_context

PATH = "/mcp"
INSTRUCTIONS = ("Serge holds this user's documents, in named knowledge collections, and their past chats with "
                "local models. list_collections names the collections; search_knowledge finds passages in one, "
                "with file and page; search_chats and read_chat find and read past conversations.")
READ_ONLY = ToolAnnotations(readOnlyHint=True, destructiveHint=False, idempotentHint=True, openWorldHint=False)
REFUSALS = (ChatNotFound, CollectionNotFound, InvalidChatInput, InvalidCollectionInput)

T = TypeVar("T")


def _owner(ctx: Context) -> str:
    request = ctx.request_context.request
    if not isinstance(request, Request):  # only the HTTP transport is served, and it always sets it
        raise ToolError("this tool answers only over Serge's /mcp endpoint")
    user = request_context(request).user
    if user is None:  # Authenticate refuses such a request before it gets here
        raise ToolError("log in first: send an API key as `Authorization: Bearer sk-serge-...`")
    return user.id


@contextmanager
def _metered(ctx: Context, app: FastAPI, texts: list[str] | None) -> Iterator[None]:
    """A tool that embeds `texts` is a model request of its user: admitted against their caps and counted."""
    request = ctx.request_context.request
    noted, reservations = request_context(request), app.state.services.reservations
    user = noted.user
    if texts is None or reservations is None or user is LOCAL_USER:
        yield
        return
    with reservations.embedding(user.id, noted.key_id or "", "mcp",
                                app.state.settings.default_embedding_model, texts):
        yield


def knowledge_server(lookup: Callable[[], Lookup], app: FastAPI) -> MCPServer:
    """The tools over the running app's `lookup()`; each runs in a worker thread (the SDK's way with plain
    functions), as Serge's queries block. A search that embeds its query is metered like any model request."""
    server = MCPServer("serge", title="Serge", version=__version__, instructions=INSTRUCTIONS,
                       log_level="WARNING")

    def _answer(ctx: Context, ask: Callable[[Lookup, str], T], embeds: list[str] | None = None) -> T:
        owner = _owner(ctx)
        try:
            with _metered(ctx, app, embeds):
                return ask(lookup(), owner)
        except (*REFUSALS, QuotaExceeded) as exc:  # what the agent can fix: said to it, as the JSON API would say it
            raise ToolError(str(exc)) from exc

    @server.tool(annotations=READ_ONLY)
    def list_collections(ctx: Context) -> list[CollectionSummary]:
        """The user's knowledge collections: id, name, how many files (and how many are indexed) and passages."""
        return _answer(ctx, lambda lookup, owner: lookup.collections(owner))

    @server.tool(annotations=READ_ONLY)
    def search_knowledge(
        collection: Annotated[str, Field(description="the collection's name (as list_collections gives it) or id",
                                         max_length=64)],
        query: Annotated[str, Field(description="what to look for, in words", max_length=2000)],
        ctx: Context,
        limit: Annotated[int, Field(description="how many passages, best first", ge=1, le=MAX_PASSAGES)] = 5,
    ) -> list[Passage]:
        """The passages of one collection that best answer `query` (searched by meaning and by words, the ranks
        fused), each with its file, page and score."""
        return _answer(ctx, lambda lookup, owner: lookup.search_knowledge(owner, collection, query, limit), [query])

    @server.tool(annotations=READ_ONLY)
    def search_chats(query: Annotated[str, Field(description="words the title or a message holds",
                                                 max_length=2000)], ctx: Context) -> list[ChatSummary]:
        """The user's chats whose title or messages hold `query` (ignoring case), newest first, with the
        words around the first match."""
        return _answer(ctx, lambda lookup, owner: lookup.search_chats(owner, query))

    @server.tool(annotations=READ_ONLY)
    def read_chat(id: Annotated[str, Field(description="the chat's id, as search_chats gives it", max_length=64)],
                  ctx: Context) -> ChatText:
        """One chat's messages (the branch on screen), oldest first."""
        return _answer(ctx, lambda lookup, owner: lookup.read_chat(owner, id))

    return server


class McpEndpoint:
    """The ASGI app at `/mcp`. The SDK's session manager runs once per start, so a new one is made each time
    the app starts (`running`, from Serge's lifespan)."""

    def __init__(self, app: FastAPI) -> None:
        self.server = knowledge_server(self._lookup, app)
        self._app = None
        self._running_lookup: Lookup | None = None

    def _lookup(self) -> Lookup:
        if self._running_lookup is None:
            raise ToolError("Serge is stopping; ask again once it has started")
        return self._running_lookup

    @asynccontextmanager
    async def running(self, lookup: Lookup) -> AsyncIterator[None]:
        self._running_lookup = lookup
        self._app = self.server.streamable_http_app(
            streamable_http_path=PATH, stateless_http=True, json_response=True,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
        try:
            async with self.server.session_manager.run():
                yield
        finally:
            self._app, self._running_lookup = None, None

    async def __call__(self, scope, receive, send):
        if self._app is None:  # a request between the app's stop and its process's end
            raise RuntimeError("Serge's MCP endpoint is not running")
        await self._app(scope, receive, send)


def install_mcp(app: FastAPI) -> McpEndpoint:
    """Route `/mcp` to the endpoint; the caller runs `endpoint.running()` in the app's lifespan."""
    endpoint = McpEndpoint(app)
    # POST only: stateless, there is no session to DELETE and nothing to push on a GET stream, which would only
    # hold a connection open; MCP's spec has such a server answer 405, which clients expect.
    app.router.add_route(PATH, endpoint, methods=["POST"], include_in_schema=False)
    return endpoint
