"""Warming a chat being read: its next reply's prompt prefilled while its user reads and types.

When the page shows a chat (opened, or shown again after a reply), or a file is attached to one,
`ChatWarming.later` asks, on a thread of its
own, for the prompt the chat's next reply will start with to be prefilled into the model's prefix cache
(`ChatService.warm` builds the conversation as the reply will; `Engine.warm` queues it below every reply),
so the send prefills only the new message. The caller never waits and never sees a failure: one is
logged. At most one warm per chat is queued or under way here, and at most `MOST_WAITING` chats wait.

It does not decide what a reply's prompt is (the chat service and the engine do), nor load a model: a
chat whose model is neither loaded nor loading is not warmed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)

MOST_WAITING = 16  # chats whose warm waits for the thread; more are not warmed (the engine keeps the newest few)
LOAD_WAIT_S = 120.0  # a chat opened while its model loads is warmed once it has loaded, within this


class ChatWarming:
    """`warm(owner, chat_id, party)` run later, one chat at a time, each chat once until its warm has been asked."""

    def __init__(self, warm: Callable[[str, str, str], bool]) -> None:
        self._warm = warm
        self._waiting: set[str] = set()  # chat ids queued or being warmed; under _lock
        self._lock = threading.Lock()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="serge-warm-chats")

    def later(self, owner: str, chat_id: str, party: str = "") -> bool:
        """Queue the chat's warm; False when it is queued already, too many wait, or warming has closed."""
        with self._lock:
            if chat_id in self._waiting or len(self._waiting) >= MOST_WAITING:
                return False
            self._waiting.add(chat_id)
        try:
            self._thread.submit(self._run, owner, chat_id, party)
        except RuntimeError:  # closed: the server is stopping
            with self._lock:
                self._waiting.discard(chat_id)
            return False
        return True

    def _run(self, owner: str, chat_id: str, party: str) -> None:
        try:
            self._warm(owner, chat_id, party)
        except Exception as exc:  # a warm is a guess about the future: it never fails anyone
            log.warning("could not warm chat %s: %s: %s", chat_id, type(exc).__name__, exc)
        finally:
            with self._lock:
                self._waiting.discard(chat_id)

    def close(self) -> None:
        """Drop what waits; the warm under way (a prompt being built, never a prefill) ends on its own."""
        self._thread.shutdown(wait=False, cancel_futures=True)
