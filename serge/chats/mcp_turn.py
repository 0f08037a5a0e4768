"""`McpTurn`: one reply that may call registered MCP servers' tools, which Serge runs between its passes.

This is the loop behind the Responses API's `mcp` tool. The model generates (a pass). When it
calls tools of the MCP servers the request named, the calls that need no approval are run
through `ToolServers`, their outputs go back to the model as tool messages, and it generates
again, up to `steps` calls in all; after that it is offered no tool and answers. A call that
needs approval ends the turn with that call asked (the client approves or denies it in its
next request); a call of the client's own functions ends it too (the client runs it).

It speaks no dialect: it yields typed events (a pass started, its deltas, a call running, a
call done, approvals asked, the turn's end), which the Responses API turns into its items and
stream events (serge/web/responses/mcp.py). Who may use which server is `ToolServers`'; which
tools a request offers and which wait for approval is `McpUse`'s. The engine only writes calls.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace

from serge.engine import ChatRequest, Engine, FinishReason, GenerationRecord, Message, Stream, Tool, ToolCall, Tools
from serge.engine.generation.stream import Delta
from serge.tools import ToolOutcome, ToolServers, ToolServerUnreachable, ToolSpec



@dataclass(frozen=True)
class ToolFilter:
    """Tools by name and by their read-only annotation; a criterion left out matches every tool."""

    names: frozenset[str] | None = None
    read_only: bool | None = None

    def matches(self, spec: ToolSpec) -> bool:
        return ((self.names is None or spec.name in self.names)
                and (self.read_only is None or spec.read_only == self.read_only))


@dataclass(frozen=True)
class McpUse:
    """One registered server a request offers the model: which of its tools, and which wait for approval (those
    `always` matches, else all but those `never` matches when `approve_all`, else none)."""

    server: str
    allowed: ToolFilter | None = None  # None: every tool of the server
    approve_all: bool = True
    always: ToolFilter | None = None
    never: ToolFilter | None = None

    def offers(self, spec: ToolSpec) -> bool:
        return self.allowed is None or self.allowed.matches(spec)

    def needs_approval(self, spec: ToolSpec) -> bool:
        if self.always is not None and self.always.matches(spec):
            return True
        if self.never is not None and self.never.matches(spec):
            return False
        return self.approve_all


@dataclass(frozen=True)
class Listing:
    """A server's tools as listed for this turn; `fresh`: listed now, not taken from the conversation."""

    server: str
    tools: tuple[ToolSpec, ...]
    error: str | None = None
    fresh: bool = True


@dataclass(frozen=True)
class McpTool:
    use: McpUse
    spec: ToolSpec

    @property
    def needs_approval(self) -> bool:
        return self.use.needs_approval(self.spec)


class ToolNameClash(ValueError):
    """Two offered tools (of two servers, or a server's and a function) share a name the model would call."""


async def list_tools(servers: ToolServers, uses: Sequence[McpUse],
                     earlier: dict[str, tuple[ToolSpec, ...]]) -> list[Listing]:
    """Each server's tools: as the conversation listed them already (`earlier`), else asked of the server now.
    A server that cannot be reached is a listing with its error, and offers nothing."""
    found = []
    for use in uses:
        if use.server in earlier:
            found.append(Listing(use.server, earlier[use.server], fresh=False))
            continue
        try:
            found.append(Listing(use.server, tuple(await servers.tools(use.server))))
        except ToolServerUnreachable as exc:
            found.append(Listing(use.server, (), error=exc.message))
    return found


def catalog(uses: Sequence[McpUse], listings: Sequence[Listing], taken: Sequence[str]) -> dict[str, McpTool]:
    """The tools offered, by the name the model calls them; `taken`: the client's own functions' names."""
    by_server = {u.server: u for u in uses}
    offered: dict[str, McpTool] = {}
    for listing in listings:
        use = by_server[listing.server]
        for spec in listing.tools:
            if not use.offers(spec):
                continue
            if spec.name in offered or spec.name in taken:
                other = offered[spec.name].use.server if spec.name in offered else "a function tool"
                raise ToolNameClash(f"the tool {spec.name!r} of {listing.server!r} has the name of one of {other}'s; "
                                    "leave one out with allowed_tools")
            offered[spec.name] = McpTool(use, spec)
    return offered


def as_function(tool: McpTool) -> Tool:
    return Tool(tool.spec.name, tool.spec.description, json.dumps(tool.spec.input_schema))


# --- what a turn reports --------------------------------------------------------------------------
@dataclass(frozen=True)
class PassStarted:
    stream: Stream


@dataclass(frozen=True)
class Generated:
    delta: Delta


@dataclass(frozen=True)
class CallRunning:
    call: ToolCall
    tool: McpTool
    approval_request_id: str | None = None  # a call the client approved in this request


@dataclass(frozen=True)
class CallDone:
    call: ToolCall
    tool: McpTool
    outcome: ToolOutcome
    approval_request_id: str | None = None


@dataclass(frozen=True)
class ApprovalAsked:
    call: ToolCall
    tool: McpTool


@dataclass(frozen=True)
class TurnEnded:
    record: GenerationRecord  # the last pass's, its token counts the sums of every pass's


TurnEvent = PassStarted | Generated | CallRunning | CallDone | ApprovalAsked | TurnEnded


@dataclass(frozen=True)
class Approved:
    """A call asked earlier and answered in this request: run it (`approve`), or not."""

    call: ToolCall
    approve: bool
    approval_request_id: str


def _summed(records: list[GenerationRecord]) -> GenerationRecord:
    last = records[-1]
    return replace(last, prompt_tokens=sum(r.prompt_tokens for r in records),
                   completion_tokens=sum(r.completion_tokens for r in records),
                   reasoning_tokens=sum(r.reasoning_tokens for r in records),
                   duration_s=sum(r.duration_s for r in records))


class McpTurn:
    def __init__(self, engine: Engine, servers: ToolServers, tools: dict[str, McpTool], steps: int) -> None:
        self.engine, self.servers, self.tools, self.steps = engine, servers, tools, steps
        self._stream: Stream | None = None
        self._cancelled = False
        self._ended = False

    # --- as a stream, for whoever watches the client ---------------------------------------
    def cancel(self) -> None:
        self._cancelled = True
        if self._stream is not None:
            self._stream.cancel()

    @property
    def done(self) -> bool:
        return self._ended

    def start(self, model: str | None, ask: ChatRequest) -> Stream:
        """The first pass, started now (so its refusals, ContextTooLong and the like, come before any answer)."""
        self._stream = self.engine.chat(model, ask)
        return self._stream

    async def approved(self, answers: Sequence[Approved]) -> AsyncIterator[CallRunning | CallDone]:
        """Run the calls this request approves (before `start`: their outputs go into the first pass's prompt);
        a denied one, or one whose tool is no longer offered, is not run (the conversation tells the model)."""
        for answer in answers:
            tool = self.tools.get(answer.call.name)
            if answer.approve and tool is not None:
                yield CallRunning(answer.call, tool, answer.approval_request_id)
                yield CallDone(answer.call, tool, await self._call(answer.call, tool), answer.approval_request_id)

    async def run(self, ask: ChatRequest, made: int = 0) -> AsyncIterator[TurnEvent]:
        """The turn's passes, after `start(ask)`; `made`: calls already made in this request (approved ones)."""
        try:
            async for event in self._passes(ask, made):
                yield event
        finally:
            self._ended = True
            if self._stream is not None and not self._stream.done:
                self._stream.cancel()

    async def _call(self, call: ToolCall, tool: McpTool) -> ToolOutcome:
        try:
            arguments = json.loads(call.arguments or "{}")
        except json.JSONDecodeError:
            arguments = None
        if not isinstance(arguments, dict):
            return ToolOutcome(f"the arguments are not a JSON object: {call.arguments[:200]!r}", True, False)
        return await self.servers.call(tool.use.server, tool.spec.name, arguments)

    async def _passes(self, ask: ChatRequest, made: int) -> AsyncIterator[TurnEvent]:
        messages, records = list(ask.messages), []
        while True:
            stream = self._stream
            yield PassStarted(stream)
            async for delta in stream.adeltas():
                yield Generated(delta)
            record = stream.record
            records.append(record)
            calls = record.tool_calls
            if record.finish_reason is not FinishReason.STOP or not calls or self._cancelled:
                break
            mine = [(c, self.tools[c.name]) for c in calls if c.name in self.tools]
            asked = [(c, t) for c, t in mine if t.needs_approval]
            run = [(c, t) for c, t in mine if not t.needs_approval]
            results = []
            for call, tool in run:
                yield CallRunning(call, tool)
                if made < self.steps:
                    outcome = await self._call(call, tool)
                    made += 1
                else:  # more calls in one pass than the steps left
                    outcome = ToolOutcome(f"not run: this reply made {self.steps} tool calls, the most it may "
                                          "(SERGE_TOOL_STEPS)", True, False)
                yield CallDone(call, tool, outcome)
                results.append(Message("tool", outcome.text, tool_call_id=call.id))
            for call, tool in asked:
                yield ApprovalAsked(call, tool)
            if asked or len(mine) < len(calls) or self._cancelled:
                break  # the client has a say: an approval to give, or its own function to run
            messages += [Message("assistant", record.text, tuple(c for c, _ in run)), *results]
            ask = replace(ask, messages=list(messages), tools=self.tools_after(ask.tools, made))
            self._stream = await asyncio.to_thread(self.engine.chat, stream.model, ask)  # it tokenizes the prompt
            if self._cancelled:  # stopped while the pass was being started
                self._stream.cancel()
        yield TurnEnded(_summed(records))

    def tools_after(self, tools: Tools | None, made: int) -> Tools | None:
        """What the next pass is offered: the tools without a forced call; none once `steps` calls are made."""
        if tools is None:
            return None
        return replace(tools, mode="none" if made >= self.steps else "auto", name=None)
