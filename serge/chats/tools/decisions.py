"""Who approves a tool call, and how the answer reaches the turn: through the database, from any process or tab.

A chat's call that needs approval is a waiting row (`serge.store.DecisionStore`): the page shows it
with its buttons in every tab (`waiting`), an Allow or Deny sent to any process answers it once
(`decide`), and the process running the reply hears of it as it hears of a Stop: a notice from the
database wakes it at once (serge/store/notices.py), and it reads the row every `poll_s` should a notice be
lost. A reload of the page leaves the call waiting. On the Responses API the turn ends with the
approval request, also kept as a row, and the request answering it takes it once (`take`): a client
that sends the same answer again runs nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from serge.chats.tools.offer import OfferedTool
from serge.chats.tools.turn import approval_id
from serge.engine import ToolCall
from serge.store import DecisionRecord, DecisionStore
from serge.store.decisions import ALLOWED, DECISION_CHANNEL, WAITING

log = logging.getLogger(__name__)

POLL_S = 1.0  # how often a waiting turn reads its row though no notice came
TICK_S = 0.05  # how soon a waiting turn sees a notice or a Stop


class ToolDecisions:
    def __init__(self, store: DecisionStore, poll_s: float = POLL_S) -> None:
        self.store, self.poll_s = store, poll_s
        self._heard: dict[str, threading.Event] = {}  # the calls this process waits on, set when answered
        self._lock = threading.Lock()
        self._listening = False  # subscribed at the first wait: a CLI command never waits, nor listens

    def person(self, owner: str, chat_id: str, always: frozenset[str], remember: Callable[[str], None],
               wait_s: float) -> PersonApproves:
        return PersonApproves(self, owner, chat_id, set(always), remember, wait_s)

    def client(self, owner: str) -> ClientApproves:
        return ClientApproves(self.store, owner)

    def decide(self, owner: str, chat_id: str, call_id: str, allow: bool, always: bool = False) -> bool:
        """A person's answer to a call of their chat; False when no call of that id waits."""
        return self.store.answer(call_id, owner, allow, always, chat_id=chat_id)

    def waiting(self, owner: str, chat_id: str) -> list[DecisionRecord]:
        return self.store.waiting(owner, chat_id)

    def take(self, owner: str, id: str, allow: bool) -> bool:
        """A client's answer to an approval request: True the first time only."""
        return self.store.answer_once(id, owner, allow)

    def wait(self, id: str, cancelled: threading.Event, wait_s: float) -> DecisionRecord | None:
        """The row once answered; None when stopped first, or not answered in `wait_s` (the row then goes)."""
        heard = threading.Event()
        with self._lock:
            self._heard[id] = heard
            if not self._listening:
                self._listening = True
                self.store.db.notices.subscribe(DECISION_CHANNEL, self._answered)
        deadline, read_at = time.monotonic() + wait_s, time.monotonic()
        try:
            while not cancelled.wait(TICK_S):
                if heard.is_set() or time.monotonic() - read_at >= self.poll_s:
                    heard.clear()
                    read_at = time.monotonic()
                    found = self.store.get(id)
                    if found is None or found.state != WAITING:
                        return found
                if time.monotonic() >= deadline:
                    return None
            return None
        finally:
            with self._lock:
                self._heard.pop(id, None)
            self.store.forget(id)

    def _answered(self, id: str) -> None:
        with self._lock:
            heard = self._heard.get(id)
        if heard is not None:
            heard.set()


class PersonApproves:
    """The page's policy: a call of a tool that is not read-only waits for the person, unless the chat always
    allows that tool; an "always allow" answer is remembered with the chat."""

    waits = True

    def __init__(self, decisions: ToolDecisions, owner: str, chat_id: str, always: set[str],
                 remember: Callable[[str], None], wait_s: float) -> None:
        self.decisions, self.owner, self.chat_id = decisions, owner, chat_id
        self.always, self.remember, self.wait_s = always, remember, wait_s
        self.timed_out = False

    def needed(self, tool: OfferedTool) -> bool:
        return tool.needs_approval and tool.key not in self.always

    def ask(self, call: ToolCall, tool: OfferedTool) -> None:
        self.decisions.store.ask(call.id, self.owner, self.chat_id, tool.server, tool.spec.name, call.arguments)

    def wait(self, call: ToolCall, tool: OfferedTool, cancelled: threading.Event) -> bool | None:
        answer = self.decisions.wait(call.id, cancelled, self.wait_s)
        if cancelled.is_set():
            return None
        if answer is None:  # nobody answered in time: denied
            return False
        allowed = answer.state == ALLOWED
        if allowed and answer.always:  # this chat runs the tool without asking from now on
            self.always.add(tool.key)
            try:
                self.remember(tool.key)
            except Exception:  # noqa: BLE001 - the call runs; only the next reply asks again
                log.warning("could not remember that chat %s always allows %s", self.chat_id, tool.key)
        return allowed


class ClientApproves:
    """The Responses API's policy: a call that needs approval (as the request's `mcp` tool says) ends the turn
    with an approval request, kept as a row for the answer to take once."""

    waits = False

    def __init__(self, store: DecisionStore, owner: str) -> None:
        self.store, self.owner = store, owner

    def needed(self, tool: OfferedTool) -> bool:
        return tool.needs_approval

    def ask(self, call: ToolCall, tool: OfferedTool) -> None:
        self.store.ask(approval_id(call.id), self.owner, None, tool.server, tool.spec.name, call.arguments)

    def wait(self, call: ToolCall, tool: OfferedTool, cancelled: threading.Event) -> bool | None:
        raise RuntimeError("the client answers in its next request")
