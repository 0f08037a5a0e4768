"""`ChatService`: every chat operation the web layer can ask for.

It checks input (sizes, settings through `SamplingParams`, the model name),
commits the user's message before generation starts, has the reply's input built
from the branch on screen (`conversation.Conversations`), and starts the reply, one at a time per
chat (`ActiveReplies` knows which are answering, in this process and in others).
It knows nothing of HTTP: callers get records, `Reply` handles, `ChatBusy` and
`InvalidChatInput`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from serge.chats.replies.active import ActiveReplies
from serge.chats.checks import (DEFAULT_TITLE, MAX_MESSAGE_CHARS, MAX_SYSTEM_PROMPT_CHARS, MAX_TITLE_CHARS,
                                InvalidChatInput, auto_title, check_settings, check_text, check_title)
from serge.chats.documents import ChatDocuments
from serge.chats.knowledge import Knowledge
from serge.chats.presets import Presets
from serge.chats.budget_words import in_chat_words
from serge.chats.replies.reply import Reply
from serge.chats.tools import ChatTools, knowledge_search
from serge.chats.conversation import Conversations
from serge.chats.replies.running import SharedReplies
from serge.chats.transfer import ChatExport, export_json
from serge.chats.replies.warming import LOAD_WAIT_S, ChatWarming
from serge.documents import MAX_FILES_PER_MESSAGE
from serge.engine import ChatRequest, Engine, ModelNotFound, SamplingParams, Stream
from serge.engine.sharing.party import current as current_party
from serge.store import (ChatRecord, ChatStore, DatabaseUnavailable, DocumentNotFound, DocumentRecord, MessageRecord,
                         NewMessage)

log = logging.getLogger(__name__)


class ChatService:
    def __init__(self, store: ChatStore, engine: Engine, documents: ChatDocuments | None = None,
                 knowledge: Knowledge | None = None, tools: ChatTools | None = None,
                 shared: SharedReplies | None = None, presets: Presets | None = None, warm: bool = False,
                 reserve: Callable[[Stream], None] = lambda stream: None) -> None:
        self.store = store
        self.reserve = reserve  # holds a reply's budget against its user's caps, or raises (it cancels the stream)
        self.engine = engine
        self.documents = documents  # None: this service takes no files
        self.knowledge = knowledge  # None: nor collections
        self.tools = tools  # None: replies call no tools
        self.presets = presets  # None: a chat's model is a model's name only
        self._conversations = Conversations(engine, documents, knowledge, presets)
        # A chat opened is warmed, and its replies cut their history to stay a prefix of the next (`warm`)
        self.warming = ChatWarming(self.warm) if warm else None
        # shared: None where this process alone writes the database (SQLite); else the service owns it from here on
        self._active = ActiveReplies(shared)

    # --- life cycle ---------------------------------------------------------------
    def recover(self) -> int:
        """At start: replies a dead server left half-written are marked interrupted."""
        count = self.store.mark_interrupted(self._active.running_elsewhere())
        if count:
            log.warning("%d reply(ies) were cut off when the server last stopped; they are marked interrupted", count)
        return count

    def close(self) -> None:
        """Stop every reply in progress and wait until each is saved."""
        self._active.close()
        if self.warming is not None:
            self.warming.close()

    # --- chats --------------------------------------------------------------------
    def _check_model(self, owner: str, model: str | None) -> str | None:
        """A model's name as the library spells it, or the name of a preset the owner may use; ModelNotFound."""
        if model and self.presets is not None and (preset := self.presets.find(owner, model)) is not None:
            return preset.name
        return self.engine.check_model(model) if model else None  # raises ModelNotFound

    def _collections(self, owner: str, refs: list[str] | None, field: str) -> list[str]:
        """The ids of the owner's collections named by id or name."""
        if not refs:
            return []
        if self.knowledge is None:
            raise InvalidChatInput("this server has no knowledge collections", field)
        return self.knowledge.resolve(owner, refs, field)

    def _tool_servers(self, user, names: list[str] | None) -> list[str]:
        """The MCP servers named, each one `user` may use (ToolServerNotFound, ToolServerForbidden say which not)."""
        if not names:
            return []
        if self.tools is None:
            raise InvalidChatInput("this server runs no tools", "tools")
        return self.tools.check(user, names)

    def create(self, owner: str, *, title: str | None = None, model: str | None = None,
               system_prompt: str | None = None, settings: dict | None = None,
               knowledge: list[str] | None = None, tools: list[str] | None = None, tool_choice: str | None = None,
               user=None) -> ChatRecord:
        """`tools`: MCP servers by name, each one `user` may use."""
        title = (check_text(title, "title", MAX_TITLE_CHARS) or "").strip() or DEFAULT_TITLE
        return self.store.create_chat(
            owner, title=title, model=self._check_model(owner, model),
            system_prompt=check_text(system_prompt, "system_prompt", MAX_SYSTEM_PROMPT_CHARS) or None,
            settings=check_settings(settings), knowledge=self._collections(owner, knowledge, "knowledge"),
            tools=self._tool_servers(user, tools), tool_choice=tool_choice,
        )

    def list(self, owner: str, query: str | None = None) -> list[ChatRecord]:
        return self.store.list_chats(owner, (query or "").strip()[:200] or None)

    def get(self, owner: str, chat_id: str) -> ChatRecord:
        return self.store.get_chat(owner, chat_id)

    def update(self, owner: str, chat_id: str, changes: dict, user=None) -> ChatRecord:
        """Change title, model, system prompt, settings, knowledge or tools; only the keys given."""
        checked = {}
        if "title" in changes:
            checked["title"] = check_title(changes["title"])
        if "model" in changes:
            checked["model"] = self._check_model(owner, changes["model"])
        if "system_prompt" in changes:
            checked["system_prompt"] = check_text(changes["system_prompt"], "system_prompt",
                                                  MAX_SYSTEM_PROMPT_CHARS) or None
        if "settings" in changes:
            checked["settings"] = check_settings(changes["settings"])
        if "knowledge" in changes:
            checked["knowledge"] = self._collections(owner, changes["knowledge"], "knowledge") or None
        if "tools" in changes:
            checked["tools"] = self._tool_servers(user, changes["tools"]) or None
        if "tool_choice" in changes:
            checked["tool_choice"] = changes["tool_choice"] or None
        if "tool_approvals" in changes:  # revoked here, never granted: only an Always allow answer grants one
            current = self.store.get_chat(owner, chat_id).tool_approvals
            if added := [k for k in changes["tool_approvals"] or () if k not in current]:
                raise InvalidChatInput(f"{added[0]!r} is not always allowed in this chat; a tool is always allowed "
                                       "by answering Always allow when it asks, and only revoked here",
                                       "tool_approvals")
            checked["tool_approvals"] = [k for k in current if k in (changes["tool_approvals"] or ())]
        return self.store.update_chat(owner, chat_id, **checked)

    def decide(self, owner: str, chat_id: str, call_id: str, allow: bool, always: bool = False) -> bool:
        """The user's Allow or Deny for a tool call of the reply in progress, in whichever process it runs; False
        when none waits by that id."""
        self.store.get_chat(owner, chat_id)  # the owner's chat, or ChatNotFound
        return self.tools is not None and self.tools.decisions.decide(owner, chat_id, call_id, allow, always)

    def waiting_calls(self, owner: str, chat_id: str) -> list[dict]:
        """The tool calls of the chat's reply that wait for an Allow or Deny, for any tab of the chat to show."""
        self.store.get_chat(owner, chat_id)
        if self.tools is None:
            return []
        return [{"id": d.id, "server": d.server, "tool": d.tool, "arguments": d.arguments, "state": "waiting",
                 "result": "", "is_error": False, "cut": False} for d in self.tools.decisions.waiting(owner, chat_id)]

    def delete(self, owner: str, chat_id: str) -> None:
        self.store.get_chat(owner, chat_id)  # not found before anything stops
        self.stop(owner, chat_id)
        if self.documents is not None:
            self.documents.store.delete_chat(owner, chat_id)
        self.store.delete_chat(owner, chat_id)

    # --- files --------------------------------------------------------------------
    def _documents(self) -> ChatDocuments:
        if self.documents is None:
            raise InvalidChatInput("this server takes no files", "file")
        return self.documents

    def attach(self, owner: str, chat_id: str, name: str, data: bytes) -> DocumentRecord:
        """Keep a file for the chat, to be attached to a message by its id; FileRefused says why not."""
        self.store.get_chat(owner, chat_id)
        document = self._documents().attach(owner, chat_id, name, data)
        self.warm_later(owner, chat_id)  # the user is writing the message it goes with
        return document

    def image(self, owner: str, chat_id: str, document_id: str) -> tuple[DocumentRecord, bytes]:
        """An image attached in the owner's chat, with its bytes (for the page's thumbnail); a file that is not
        an image is not found here."""
        document = self._documents().store.get(owner, document_id)
        if document.chat_id != chat_id or not document.media_type.startswith("image/"):
            raise DocumentNotFound(f"chat {chat_id!r} has no image {document_id!r}")
        return document, self._documents().store.read(owner, document_id)

    def files(self, owner: str, chat_id: str) -> list[DocumentRecord]:
        self.store.get_chat(owner, chat_id)
        return self._documents().store.list(owner, chat_id)

    def _check_attachments(self, owner: str, chat_id: str, attachments: list[str]) -> list[str] | None:
        if not attachments:
            return None
        if len(attachments) > MAX_FILES_PER_MESSAGE:
            raise InvalidChatInput(f"attachments lists {len(attachments)} files; the limit is "
                                   f"{MAX_FILES_PER_MESSAGE} per message", "attachments")
        for document_id in attachments:
            if self._documents().store.get(owner, document_id).chat_id != chat_id:
                raise DocumentNotFound(f"chat {chat_id!r} has no document {document_id!r}; upload it to this chat")
        return list(dict.fromkeys(attachments))

    def select(self, owner: str, chat_id: str, message_id: str) -> ChatRecord:
        """Flip to another version of a message (and the conversation that follows it)."""
        self.store.get_chat(owner, chat_id)  # another owner's chat is not found, busy or not
        self._active.refuse_if_busy(chat_id)
        return self.store.select_branch(owner, chat_id, message_id)

    def export(self, owner: str, chat_id: str) -> dict:
        chat = self.store.get_chat(owner, chat_id)
        preset = self.presets.exported(owner, chat.model) if self.presets is not None else None
        return export_json(chat, self.store.all_messages(owner, chat_id), preset)

    def import_chat(self, owner: str, data: ChatExport, user=None) -> ChatRecord:
        """`user`: the account importing, whose tool servers the chat keeps (those it may not use are left out)."""
        chat = data.chat
        usable = set(self.tools.usable(user)) if self.tools is not None else set()
        tools = [name for name in dict.fromkeys(chat.tools) if name in usable]
        settings = check_settings(chat.settings)
        adopt = None  # the preset the chat used, to be made the importer's own once the rest is checked
        try:
            model = self._check_model(owner, chat.model)
        except ModelNotFound as exc:
            if chat.preset is None or chat.preset.name != chat.model or self.presets is None:
                raise InvalidChatInput(f"chat.model: {exc} (or set chat.model to null for the default)",
                                       "chat.model") from None
            model, adopt = chat.model, chat.preset
        check_text(chat.system_prompt, "chat.system_prompt", MAX_SYSTEM_PROMPT_CHARS)
        for i, m in enumerate(data.messages):
            check_text(m.content, f"messages.{i}.content", MAX_MESSAGE_CHARS)
            check_text(m.reasoning, f"messages.{i}.reasoning", MAX_MESSAGE_CHARS)
        if adopt is not None:
            self.presets.adopt(owner, adopt)
        try:
            return self.store.import_chat(
                owner,
                {**chat.model_dump(exclude={"preset"}),
                 "title": chat.title.strip()[:MAX_TITLE_CHARS] or DEFAULT_TITLE, "model": model, "settings": settings,
                 "tools": tools, "tool_approvals": [a for a in chat.tool_approvals if a.split("/", 1)[0] in tools]},
                [m.model_dump() for m in data.messages],
                data.current_id,
            )
        except ValueError as exc:
            raise InvalidChatInput(str(exc), "messages") from None

    # --- warming a chat being read -------------------------------------------------
    def warm_later(self, owner: str, chat_id: str) -> None:
        """In the background, `warm` the owner's chat (which the caller has read): never waits, never raises."""
        if self.warming is not None:
            self.warming.later(owner, chat_id, current_party())

    def warm(self, owner: str, chat_id: str, party: str = "") -> bool:
        """Have the prompt the chat's next reply will start with prefilled into its model's prefix cache, below
        every reply (`Engine.warm`), so the send prefills only the new message; never loads a model. False
        when nothing was queued: an empty chat, one answering now, one with tools (its prompt is the tool
        loop's), images, a model neither loaded nor loading, a remote one."""
        chat = self.store.get_chat(owner, chat_id)
        if not chat.messages or chat_id in self._active:
            return False
        history, _, _ = self._conversations.branch(owner, chat, chat.messages[-1])
        model, settings, preset = self._conversations.model_for(owner, chat, history)
        if chat.tools or (preset is not None and preset.tools):
            return False
        return self.engine.warm(model, ChatRequest(history, SamplingParams(**settings), party=party), LOAD_WAIT_S)

    # --- replies ------------------------------------------------------------------
    def reply(self, owner: str, chat_id: str, content: str, attachments: list[str] | None = None,
              knowledge: list[str] | None = None, user=None) -> Reply:
        """Save the user's message (with the ids of the chat's files it comes with, and of the collections it
        names), then start the reply to it."""
        check_text(content, "content", MAX_MESSAGE_CHARS, required=True)
        caller = user
        chat = self.store.get_chat(owner, chat_id)
        attached = self._check_attachments(owner, chat_id, attachments or [])
        named = self._collections(owner, knowledge, "knowledge") or None
        self._active.reserve(chat_id, owner)
        try:
            user = self.store.add_message(owner, chat_id, NewMessage("user", content, attachments=attached,
                                                                     knowledge=named))
            if not chat.messages and chat.title == DEFAULT_TITLE:
                self.store.update_chat(owner, chat_id, title=auto_title(content))
            # the branch read above, with the question on it (read again only if it moved in between)
            chat = (replace(chat, messages=(*chat.messages, user), current_id=user.id)
                    if user.parent_id == chat.current_id else None)
            return self._start(owner, chat_id, user, user, chat, caller)
        except BaseException:
            self._active.release(chat_id)
            raise

    def regenerate(self, owner: str, chat_id: str, user=None) -> Reply:
        """A new reply to the last question; the old one stays as an alternative."""
        chat = self.store.get_chat(owner, chat_id)
        if not chat.messages:
            raise InvalidChatInput("this chat has no message to answer yet", "chat")
        last = chat.messages[-1]
        question = last if last.role == "user" else next(
            (m for m in reversed(chat.messages) if m.id == last.parent_id), None)
        if question is None or question.role != "user":
            raise InvalidChatInput("the last reply does not follow a user message", "chat")
        self._active.reserve(chat_id, owner)
        try:
            return self._start(owner, chat_id, question, None, chat, user)
        except BaseException:
            self._active.release(chat_id)
            raise

    def edit_and_resend(self, owner: str, chat_id: str, message_id: str, content: str, user=None) -> Reply:
        """Branch from an earlier user message with new text; the old branch is kept."""
        check_text(content, "content", MAX_MESSAGE_CHARS, required=True)
        caller = user
        original = self.store.get_message(owner, chat_id, message_id)
        if original.role != "user":
            raise InvalidChatInput("only your own messages can be edited", "message_id")
        self._active.reserve(chat_id, owner)
        try:
            user = self.store.add_message(owner, chat_id, NewMessage(
                "user", content, parent_id=original.parent_id, after_current=False, attachments=original.attachments,
                knowledge=original.knowledge))
            return self._start(owner, chat_id, user, user, None, caller)
        except BaseException:
            self._active.release(chat_id)
            raise

    def stop(self, owner: str, chat_id: str, timeout: float = 30.0) -> MessageRecord | None:
        """Stop the reply in progress; its partial text is kept. None when nothing ran."""
        self.store.get_chat(owner, chat_id)  # the owner's chat, or ChatNotFound
        reply = self._active.get(chat_id)
        if reply is None:
            message_id = self._active.stop_elsewhere(chat_id, timeout)  # another process's reply, once saved
            return self.store.get_message(owner, chat_id, message_id) if message_id else None
        reply.cancel()
        return reply.wait(timeout)

    def _start(self, owner: str, chat_id: str, question: MessageRecord, user: MessageRecord | None,
               chat: ChatRecord | None = None, caller=None) -> Reply:
        """Start the reply to `question`; `chat`: the chat as read already, its branch on screen ending at or
        past the question (None: read it now); `caller`: the account asking, whose tools the chat may use."""
        chat = chat or self.store.get_chat(owner, chat_id)
        asked = self._conversations.asked(owner, chat, question)
        model, settings, preset = asked.model, asked.settings, asked.preset
        try:
            placeholder = self.store.add_message(owner, chat_id, NewMessage(
                "assistant", "", parent_id=question.id, after_current=False, model=model, settings=settings,
                complete=False))
        except DatabaseUnavailable as exc:
            if user is None:
                raise
            raise DatabaseUnavailable(exc.reason, "your message is saved, but no reply was started; press "
                                                  "Regenerate once that is fixed") from exc
        try:
            if preset is not None and preset.tools and not chat.tools:  # a preset's servers, where the chat ticks none
                chat = replace(chat, tools=tuple(preset.tools),  # and its tool choice, where the chat left it at auto
                               tool_choice=preset.tool_choice if chat.tool_choice == "auto" else chat.tool_choice)
            if self.tools is not None and chat.tools:
                search = knowledge_search(self.documents, owner, [*asked.attached, *asked.collections])
                stream = self.tools.reply(owner, chat, model, asked.history, caller, search, settings)
            else:
                stream = self.engine.chat(model, ChatRequest(asked.history, SamplingParams(**settings),
                                                             keep_cut=self.warming is not None))
            self.reserve(stream)
        except Exception as exc:
            said = in_chat_words(exc, chat, preset)  # a budget too small for the first tool call: in the chat's words
            self.store.finish_message(owner, placeholder.id, finish_reason="error", complete=False, error=str(said))
            if said is exc:
                raise
            raise said from exc
        # the engine counts what it left out of `history`; the page counts messages on the branch
        dropped = asked.places[stream.dropped_messages - 1] + 1 if stream.dropped_messages else 0
        reply = Reply(self.store, owner, chat_id, placeholder, user, stream, self._active.release, dropped,
                      asked.sources)
        self._active.started(reply)
        return reply

