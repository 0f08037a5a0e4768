"""Which tools a chat's reply is offered, and the `ToolLoop` that runs them: the chat service's side of tools.

A chat names servers (`chats.tools`): MCP servers registered by an admin, each checked
against the user asking (`ToolServers.usable`), and `serge`, Serge's own knowledge search
(`search_knowledge`) over the chat's collections and files, which every user may tick.
For a reply, each named server's tools are listed (a server that cannot be reached is
left out, and the reply shows why) and handed to a `ToolLoop`. MCP calls run on the
`ToolServers`' event loop; this module only bridges the reply's thread to it.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable, Sequence

from serge.chats.tools import KNOWLEDGE_SERVER, ToolLoop, function_names
from serge.engine import Engine, Message, SamplingParams
from serge.store import ChatRecord, ChatStore
from serge.tools import ToolOutcome, ToolServerError, ToolServers, ToolSpec

log = logging.getLogger(__name__)

SEARCH_KNOWLEDGE = ToolSpec(
    server=KNOWLEDGE_SERVER, name="search_knowledge",
    description="Search the files and knowledge collections of this chat; returns the best passages with their "
                "file and page.",
    input_schema={"type": "object", "properties": {
        "query": {"type": "string", "description": "what to look for"},
        "limit": {"type": "integer", "minimum": 1, "maximum": 10, "description": "passages wanted (5 if left out)"},
    }, "required": ["query"]},
    read_only=True)


class ChatTools:
    def __init__(self, servers: ToolServers, store: ChatStore, engine: Engine, *, steps: int,
                 approval_wait_s: float = 900.0) -> None:
        self.servers, self.store, self.engine = servers, store, engine
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

    def loop(self, owner: str, chat: ChatRecord, model: str, history: list[Message], user,
             search: Callable | None, settings: dict | None = None) -> ToolLoop:
        """The reply's tool loop over the chat's ticked servers; `settings`: its sampling (the chat's by
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

        params = SamplingParams(**(chat.settings if settings is None else settings))
        loop = ToolLoop(self.engine, model, history, params, function_names(specs), run,
                        steps=self.steps, choice=chat.tool_choice, always=frozenset(chat.tool_approvals),
                        remember=remember, wait_s=self.approval_wait_s)
        loop.tool_log.extend(notes)
        return loop


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
