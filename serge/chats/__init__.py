"""The conversation service: what a chat is, how a turn is built, saved and stopped."""

from serge.chats.replies import Reply
from serge.chats.service import ChatBusy, ChatService, InvalidChatInput
from serge.chats.transfer import ChatExport, export_markdown
from serge.store import ChatNotFound, MessageNotFound

__all__ = [
    "ChatBusy", "ChatExport", "ChatNotFound", "ChatService", "InvalidChatInput", "MessageNotFound", "Reply",
    "export_markdown",
]
