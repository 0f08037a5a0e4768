"""`Lookup`: what another agent may read of one user's own things (their collections, passages and chats).

Serge's `/mcp` endpoint offers these to agents such as Claude Code or Codex. Every method takes the owner
first and never reaches past it: another user's collection or chat is not found, exactly as on the JSON API.
The passages come from the same hybrid search a reply uses (`ChatDocuments.rank`: by meaning and by words,
fused), with file and page. Results are bounded (how many, how long), so an agent's question cannot make
Serge send megabytes. It speaks no protocol: the MCP tools around it live in serge/web/mcp.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from serge.chats.checks import InvalidChatInput
from serge.chats.documents import CANDIDATES, ChatDocuments
from serge.chats.knowledge import Knowledge
from serge.chats.service import ChatService

MAX_QUERY_CHARS = 2_000
MAX_PASSAGES = CANDIDATES  # what each search brings to the fusion: more would not be ranked by both
MAX_CHATS = 50
MAX_CHAT_CHARS = 200_000  # of one chat's text read back; longer messages are cut, and say so
SNIPPET_CHARS = 200


@dataclass(frozen=True)
class CollectionSummary:
    id: str
    name: str
    files: int
    files_indexed: int
    passages: int


@dataclass(frozen=True)
class Passage:
    collection: str
    file: str
    page: int
    passage: str
    score: float


@dataclass(frozen=True)
class ChatSummary:
    id: str
    title: str
    updated_at: datetime
    match: str | None  # a little of the title where it holds the query, else of the first message that does


@dataclass(frozen=True)
class ChatToolCall:
    """A tool a reply called, as the page shows it folded: which, with what, and what came back."""

    server: str
    tool: str
    arguments: str  # JSON text, as the model wrote it
    state: str  # done, error, denied, stopped, waiting or running
    result: str


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str
    created_at: datetime
    tool_calls: tuple[ChatToolCall, ...] = ()  # a reply's, in the order it made them


@dataclass(frozen=True)
class ChatText:
    id: str
    title: str
    messages: tuple[ChatMessage, ...]
    truncated: bool  # the chat was longer than MAX_CHAT_CHARS: its later messages are cut


def check_query(query: str) -> str:
    query = (query or "").strip()
    if not query:
        raise InvalidChatInput("the query is empty; say what to look for")
    if len(query) > MAX_QUERY_CHARS:
        raise InvalidChatInput(f"the query is {len(query)} characters; the limit is {MAX_QUERY_CHARS}")
    return query


def _snippet(text: str, needle: str) -> str:
    at = text.lower().find(needle.lower())
    start = max(0, at - SNIPPET_CHARS // 2)
    cut = text[start:start + SNIPPET_CHARS]
    return ("…" if start else "") + cut + ("…" if start + SNIPPET_CHARS < len(text) else "")


class Lookup:
    def __init__(self, knowledge: Knowledge, documents: ChatDocuments, chats: ChatService) -> None:
        self.knowledge, self.documents, self.chats = knowledge, documents, chats

    def collections(self, owner: str) -> list[CollectionSummary]:
        return [CollectionSummary(c.id, c.name, c.files, c.files_indexed, c.passages)
                for c in self.knowledge.list(owner)]

    def search_knowledge(self, owner: str, collection: str, query: str, limit: int = 5) -> list[Passage]:
        """The owner's collection's best passages for `query` (collection by name or id; CollectionNotFound)."""
        query = check_query(query)
        if not 1 <= limit <= MAX_PASSAGES:
            raise InvalidChatInput(f"limit is {limit}; it must be 1 to {MAX_PASSAGES}")
        [collection_id] = self.knowledge.resolve(owner, [collection], "collection")
        in_collection, names = self.knowledge.searchable(owner, [collection_id])
        if not in_collection:
            return []
        files = self.documents.store.names(owner, list(in_collection))
        return [Passage(names[collection_id], files[r.hit.document_id], r.hit.page, r.hit.text, round(r.score, 6))
                for r in self.documents.rank(owner, list(in_collection), query)[:limit]]

    def search_chats(self, owner: str, query: str) -> list[ChatSummary]:
        """The owner's chats whose title or messages hold `query` (ignoring case), newest activity first."""
        query = check_query(query)
        found = []
        for chat in self.chats.store.list_chats(owner, query, limit=MAX_CHATS):
            if query.lower() in chat.title.lower():
                found.append(ChatSummary(chat.id, chat.title, chat.updated_at, _snippet(chat.title, query)))
                continue
            holding = next((m.content for m in self.chats.store.all_messages(owner, chat.id)
                            if query.lower() in (m.content or "").lower()), None)
            found.append(ChatSummary(chat.id, chat.title, chat.updated_at,
                                     _snippet(holding, query) if holding else None))
        return found

    def read_chat(self, owner: str, chat_id: str) -> ChatText:
        """The chat's branch on screen, oldest first (ChatNotFound for another's); cut at MAX_CHAT_CHARS."""
        chat = self.chats.get(owner, chat_id)
        messages, room = [], MAX_CHAT_CHARS
        for m in chat.messages:
            content = m.content or ""
            calls = tuple(ChatToolCall(str(c.get("server", "")), str(c.get("tool", "")), str(c.get("arguments", "")),
                                       str(c.get("state", "done")), str(c.get("result", "")))
                          for c in m.tool_calls or ())
            size = len(content) + sum(len(c.arguments) + len(c.result) for c in calls)
            if size > room:
                messages.append(ChatMessage(m.role, content[:room] + " [cut: the chat goes on]", m.created_at))
                return ChatText(chat.id, chat.title, tuple(messages), True)
            room -= size
            messages.append(ChatMessage(m.role, content, m.created_at, calls))
        return ChatText(chat.id, chat.title, tuple(messages), False)
