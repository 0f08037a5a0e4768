"""The conversation service: what a chat is, how a turn is built, saved and stopped."""

from serge.chats.checks import MAX_MESSAGE_CHARS, MAX_SYSTEM_PROMPT_CHARS, InvalidChatInput
from serge.chats.indexing import Indexer
from serge.chats.knowledge import CollectionReadOnly, InvalidCollectionInput, Knowledge
from serge.chats.presets import InvalidPresetInput, PresetForbidden, PresetModelMissing, Presets, PresetView
from serge.chats.replies.reply import Reply
from serge.chats.replies.active import ChatBusy
from serge.chats.service import ChatService
from serge.chats.transfer import ChatExport, export_markdown
from serge.store import ChatNotFound, MessageNotFound

__all__ = [
    "MAX_MESSAGE_CHARS", "MAX_SYSTEM_PROMPT_CHARS", "ChatBusy", "Indexer", "CollectionReadOnly", "InvalidCollectionInput", "Knowledge", "ChatExport", "ChatNotFound", "ChatService", "InvalidChatInput", "MessageNotFound", "Reply",
    "export_markdown", "InvalidPresetInput", "PresetForbidden", "PresetModelMissing", "Presets", "PresetView",
]
