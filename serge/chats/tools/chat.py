"""A chat's tools: which a reply is offered, and the reply's `ToolTurn` read as the page reads a reply.

A chat names servers (`chats.tools`): MCP servers registered by an admin, each checked against
the user asking (`ToolServers.usable`), and `serge`, Serge's own knowledge search
(`search_knowledge`) over the chat's collections and files, which every user may tick. For a
reply, each named server's tools are listed (a server that cannot be reached is left out, and
the reply shows why) and handed to a `ToolTurn` whose approvals are the person's (decisions.py).
`ToolReply` stands where the engine's `Stream` stands for a `Reply`: text deltas, and each call as
a `ToolDelta` (its stored entry) as it changes. MCP calls run on the `ToolServers`' event loop;
this module only bridges the reply's thread to it.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from serge.chats.tools.decisions import ToolDecisions
from serge.chats.tools.offer import KNOWLEDGE_SERVER, SEARCH_KNOWLEDGE, function_names
from serge.chats.tools.turn import (MAX_ARGUMENT_CHARS, ApprovalWanted, CallDone, CallRunning, Generated, ToolTurn)
from serge.engine import ChatRequest, Engine, GenerationRecord, Message, SamplingParams, Tools
from serge.store import ChatRecord, ChatStore
from serge.tools import ToolOutcome, ToolServerError, ToolServers, ToolSpec

log = logging.getLogger(__name__)

APPROVAL_WAIT_S = 900.0  # a call nobody allows or denies in this time is denied


@dataclass(frozen=True)
class ToolDelta:
    """A change to one call of the reply (`tool`: its stored entry), read by `Reply` beside text deltas."""

    tool: dict
    text: str = ""
    reasoning: str = ""


class ToolReply:
    """A reply's `ToolTurn`, read as a `Stream` (deltas, close, cancel, watch, done, records)."""

    def __init__(self, turn: ToolTurn, notes: Sequence[dict]) -> None:
        self.turn = turn
        self.tool_log: list[dict] = list(notes)  # each call, as stored with the message
        self.waiting = False  # a call waits for the person's answer
        self.model, self.dropped_messages = turn.model, turn.dropped_messages
        self.prompt_tokens, self.max_new_tokens, self.choices = turn.prompt_tokens, turn.max_new_tokens, 1

    @property
    def done(self) -> bool:
        return self.turn.done

    @property
    def queue_position(self) -> int | None:
        return self.turn.queue_position

    @property
    def records(self) -> tuple[GenerationRecord, ...]:
        return self.turn.records

    def watch(self, wake: Callable[[], None]) -> Callable[[], None]:
        return self.turn.watch(wake)

    def cancel(self) -> None:
        self.turn.cancel()

    def close(self, timeout: float = 30.0) -> GenerationRecord:
        return self.turn.close(timeout)

    def deltas(self):
        for note in list(self.tool_log):  # servers that could not be reached, said first
            yield ToolDelta(dict(note))
        entries: dict[str, dict] = {}
        events = self.turn.events()
        try:
            for event in events:
                if isinstance(event, Generated):
                    if event.delta.text or event.delta.reasoning:
                        yield event.delta
                elif isinstance(event, ApprovalWanted | CallRunning | CallDone) and getattr(event, "state", "") \
                        != "repeated":  # a call asked again is not run, and not shown twice
                    yield ToolDelta(dict(self._entry(entries, event)))
        finally:
            events.close()

    def _entry(self, entries: dict[str, dict], event) -> dict:
        call, tool = event.call, event.tool
        entry = entries.get(call.id)
        if entry is None:
            entry = entries[call.id] = {
                "id": call.id, "server": tool.server if tool else "", "tool": tool.spec.name if tool else call.name,
                "arguments": call.arguments[:MAX_ARGUMENT_CHARS], "state": "running", "result": "",
                "is_error": False, "cut": False}
            self.tool_log.append(entry)
        self.waiting = isinstance(event, ApprovalWanted)
        if isinstance(event, ApprovalWanted):
            entry["state"] = "waiting"
        elif isinstance(event, CallRunning):
            entry["state"] = "running"
        else:
            outcome = event.outcome
            entry.update(state=event.state, result=outcome.text, is_error=outcome.is_error, cut=outcome.cut)
        return entry


class ChatTools:
    def __init__(self, servers: ToolServers, store: ChatStore, engine: Engine, decisions: ToolDecisions, *,
                 steps: int, approval_wait_s: float = APPROVAL_WAIT_S) -> None:
        self.servers, self.store, self.engine, self.decisions = servers, store, engine, decisions
        self.steps, self.approval_wait_s = steps, approval_wait_s

    def usable(self, user) -> list[str]:
        """What `user` may tick: Serge's knowledge search, then the MCP servers they may use."""
        return [KNOWLEDGE_SERVER, *self.servers.usable(user)]

    def check(self, user, names: Sequence[str]) -> list[str]:
        names = list(dict.fromkeys(names))
        self.servers.check(user, [n for n in names if n != KNOWLEDGE_SERVER])
        return names

    def offered(self, user, names: Sequence[str], search: Callable | None) -> tuple[list[ToolSpec], list[dict]]:
        """The tools of those of `names` `user` may still use, and a note for each server that cannot be reached."""
        allowed = set(self.usable(user))
        specs, notes = [], []
        for name in names:
            if name not in allowed:
                continue
            if name == KNOWLEDGE_SERVER:
                if search is not None:
                    specs.append(SEARCH_KNOWLEDGE)
                continue
            try:
                specs += self.servers.submit(self.servers.tools(name)).result(self.servers.timeout_s + 5)
            except (ToolServerError, concurrent.futures.TimeoutError) as exc:
                message = getattr(exc, "message", None) or f"the tool server {name!r} did not answer in time"
                log.warning("chat tools: %s", message)
                notes.append({"id": f"unreachable-{name}", "server": name, "tool": "", "arguments": "",
                              "state": "error", "result": message, "is_error": True, "cut": False})
        return specs, notes

    def reply(self, owner: str, chat: ChatRecord, model: str, history: list[Message], user,
              search: Callable | None, settings: dict | None = None) -> ToolReply:
        """The reply's tool turn over the chat's ticked servers; `settings`: its sampling (the chat's by
        default; a preset's under the chat's own where the chat names one)."""
        specs, notes = self.offered(user, chat.tools, search)
        servers = self.servers

        def run(spec: ToolSpec, arguments: dict) -> concurrent.futures.Future:
            if spec.server == KNOWLEDGE_SERVER:
                done: concurrent.futures.Future = concurrent.futures.Future()
                try:
                    query = str(arguments.get("query") or "")[:2000]
                    limit = arguments.get("limit") if isinstance(arguments.get("limit"), int) else 5
                    text = search(query, limit) if search is not None and query else "give a query to search for"
                    done.set_result(ToolOutcome(text[:servers.output_chars], False, len(text) > servers.output_chars))
                except Exception as exc:  # noqa: BLE001 - the model is told
                    done.set_result(ToolOutcome(f"the search failed: {exc}", True, False))
                return done
            return servers.submit(servers.call(spec.server, spec.name, arguments))

        def remember(key: str) -> None:
            current = self.store.get_chat(owner, chat.id).tool_approvals
            if key not in current:
                self.store.update_chat(owner, chat.id, tool_approvals=[*current, key])

        offered = function_names(specs)
        choice = chat.tool_choice
        tools = None
        if offered and self.steps > 0:
            tools = Tools(tuple(tool.as_function(name) for name, tool in offered.items()),
                          "required" if choice in ("first", "always") else "auto", parallel=False)
        params = SamplingParams(**(chat.settings if settings is None else settings))
        approvals = self.decisions.person(owner, chat.id, frozenset(chat.tool_approvals), remember,
                                          self.approval_wait_s)
        turn = ToolTurn(lambda ask: self.engine.chat(model, ask), ChatRequest(history, params, tools=tools),
                        offered, run, approvals, steps=self.steps, force_every_pass=choice == "always")
        return ToolReply(turn, notes)


def knowledge_search(documents, owner: str, document_ids: Sequence[str]) -> Callable[[str, int], str] | None:
    """`search_knowledge` for one reply, over these documents (the chat's files and its collections' files), with
    the hybrid ranking replies' own retrieval uses; None when there is nothing to search."""
    ids = list(dict.fromkeys(document_ids))
    if documents is None or not ids:
        return None

    def search(query: str, limit: int = 5) -> str:
        names = documents.store.names(owner, ids)
        found = [f"[{names.get(r.hit.document_id, '?')}, page {r.hit.page}] {r.hit.text}"
                 for r in documents.rank(owner, ids, query)[:max(1, min(limit, 10))]]
        return "\n\n".join(found) or "nothing in the chat's files and collections matches"
    return search
