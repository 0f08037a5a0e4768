"""`ActiveReplies`: which chats are answering now, so that a chat has one reply at a time.

This process's replies are kept by chat id (a reply can be stopped from another request); on a
database several processes share, each reply is also claimed there first (`SharedReplies`), so a
chat answering in one process is busy in all, and a Stop sent to any of them stops it. The registry
belongs to the chat service that made it; nothing here is global. It knows nothing of messages,
models or HTTP.
"""

from __future__ import annotations

import threading

from serge.chats.replies.reply import Reply
from serge.chats.replies.running import SharedReplies

BUSY = "this chat is still answering; stop the reply or wait for it to finish"


class ChatBusy(RuntimeError):
    """The chat already has a reply in progress."""


class ActiveReplies:
    """The replies in progress, by chat id; `shared`: every process's claims (None: this process alone writes
    the database, as with SQLite), owned from here on."""

    def __init__(self, shared: SharedReplies | None = None) -> None:
        self._replies: dict[str, Reply | None] = {}  # None: reserved while the reply starts
        self._lock = threading.Lock()
        self._shared = shared.start(self._stop_asked) if shared is not None else None

    def get(self, chat_id: str) -> Reply | None:
        return self._replies.get(chat_id)

    def __contains__(self, chat_id: str) -> bool:
        return chat_id in self._replies

    def refuse_if_busy(self, chat_id: str, here_only: bool = False) -> None:
        if chat_id in self._replies or (not here_only and self._shared is not None and self._shared.running(chat_id)):
            raise ChatBusy(BUSY)

    def reserve(self, chat_id: str, owner: str) -> None:
        """The chat is this process's to answer (ChatBusy if any process answers it), until `release`."""
        with self._lock:
            self.refuse_if_busy(chat_id, here_only=True)
            self._replies[chat_id] = None
        if self._shared is not None:
            try:
                claimed = self._shared.claim(chat_id, owner)
            except BaseException:
                self.release(chat_id, claimed=False)
                raise
            if not claimed:  # another process is answering this chat
                self.release(chat_id, claimed=False)
                raise ChatBusy(BUSY)

    def started(self, reply: Reply) -> None:
        """The reserved chat's reply runs; it is cancelled at once if a Stop reached another process first."""
        with self._lock:
            self._replies[reply.chat_id] = reply
        reply.start()
        if self._shared is not None and self._shared.started(reply.chat_id, reply.message_id):
            reply.cancel()

    def release(self, reply_or_chat: Reply | str, claimed: bool = True) -> None:
        """A reply saved (or a reservation given up): the chat may answer again. A reply releases only its own."""
        chat_id = reply_or_chat if isinstance(reply_or_chat, str) else reply_or_chat.chat_id
        with self._lock:
            if isinstance(reply_or_chat, str):
                released = self._replies.pop(chat_id, False) is not False
            elif released := self._replies.get(chat_id) is reply_or_chat:
                del self._replies[chat_id]
        if released and claimed and self._shared is not None:
            self._shared.release(chat_id)

    def stop_elsewhere(self, chat_id: str, timeout: float) -> str | None:
        """Another process's reply in the chat, stopped and saved: its message id (None: none ran)."""
        return self._shared.stop_elsewhere(chat_id, timeout) if self._shared is not None else None

    def running_elsewhere(self) -> set[str]:
        """The chats other live processes are answering (at start: the rest were cut off)."""
        return self._shared.running_chats() if self._shared is not None else set()

    def close(self) -> None:
        """Stop every reply in progress and wait until each is saved."""
        with self._lock:
            replies = [r for r in self._replies.values() if r is not None]
        for reply in replies:
            reply.cancel()
        for reply in replies:
            reply.wait(30)
        if self._shared is not None:
            self._shared.close()

    def _stop_asked(self, chat_id: str) -> None:
        """Another process asked (through the database) to stop this process's reply in the chat."""
        if reply := self._replies.get(chat_id):
            reply.cancel()
