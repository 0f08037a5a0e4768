"""`ToolTurn`: one reply that may call tools: model pass, call asked, approval wanted, call result, answer.

The only loop that runs tools, for the chat page's replies (chats/tools/chat.py) and the Responses
API's `mcp` tool (web/responses/mcp_api.py) alike: it yields typed events, which each caller turns
into its own shapes. Its rules, kept here once:
- every pass starts through `start`, the caller's door to the engine (which resolves a preset's name
  as every route does), and every pass is counted: `record` sums the tokens all passes read and wrote;
- a call runs through `run` (an MCP server's, or Serge's own search), at most `steps` calls a turn;
  past them, or when the model (not forced to) asks again for calls it made with the same arguments,
  the next pass is offered no tool and answers;
- a call that needs approval goes to the `approvals` policy: a person's (the page: the turn waits for
  their answer, kept in the database) or the client's (the API: the turn ends asking, and the
  client's next request answers, taken once: `approved`);
- a call of a function the client runs itself ends the turn, for the client to run it.
It runs on one thread (a reply's, or one of the server pool's); `cancel`, from any thread, ends the
pass, the wait and the call in flight. It does not choose the tools (offer.py) nor run MCP sessions.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from serge.chats.tools.offer import OfferedTool
from serge.engine import (ChatRequest, Delta, FinishReason, GenerationRecord, InvalidRequest, Message, Stream, ToolCall,
                          Tools)
from serge.tools import ToolOutcome, ToolServerError, ToolSpec

MAX_ARGUMENT_CHARS = 100_000


def approval_id(call_id: str) -> str:
    """The approval request's id for a call: one name for the item a client sees and the row that takes its
    answer."""
    return "mcpr_" + call_id.removeprefix("call_")


# --- what a turn reports ----------------------------------------------------------------------------
@dataclass(frozen=True)
class PassStarted:
    stream: Stream


@dataclass(frozen=True)
class Generated:
    delta: Delta


@dataclass(frozen=True)
class ApprovalWanted:
    """The turn waits for a person's Allow or Deny of this call."""

    call: ToolCall
    tool: OfferedTool


@dataclass(frozen=True)
class ApprovalAsked:
    """The turn ends asking the client to approve this call (it answers in its next request)."""

    call: ToolCall
    tool: OfferedTool


@dataclass(frozen=True)
class CallRunning:
    call: ToolCall
    tool: OfferedTool
    approval_id: str | None = None  # a call the client approved in this request


@dataclass(frozen=True)
class CallDone:
    call: ToolCall
    tool: OfferedTool | None  # None: the model named no tool offered
    outcome: ToolOutcome
    state: str  # done, error, denied, stopped, or repeated (asked again, not run: the page leaves it out)
    approval_id: str | None = None


@dataclass(frozen=True)
class TurnEnded:
    record: GenerationRecord  # the last pass's, its token counts the sums of every pass's


TurnEvent = PassStarted | Generated | ApprovalWanted | ApprovalAsked | CallRunning | CallDone | TurnEnded


class Approvals(Protocol):
    """Who approves a call, and how the turn learns the answer."""

    waits: bool  # True: the turn waits for the answer; False: it ends asking

    def needed(self, tool: OfferedTool) -> bool: ...

    def ask(self, call: ToolCall, tool: OfferedTool) -> None: ...

    def wait(self, call: ToolCall, tool: OfferedTool, cancelled: threading.Event) -> bool | None:
        """True (allowed), False (denied, or not answered in time), None (the turn was stopped)."""


@dataclass(frozen=True)
class Approved:
    """A call asked in an earlier response and answered in this request: run it (`approve`), or not."""

    call: ToolCall
    approve: bool
    approval_id: str


class AlreadyAnswered(Exception):
    """An approval request answered before: its call ran (or was refused) then, and is not run again."""

    def __init__(self, approval_id: str) -> None:
        super().__init__(f"the approval request {approval_id!r} was answered already; its call is not run again")
        self.approval_id = approval_id


Run = Callable[[ToolSpec, dict], concurrent.futures.Future]


def arguments_of(call: ToolCall) -> dict | None:
    try:
        arguments = json.loads(call.arguments or "{}")
    except ValueError:
        return None
    return arguments if isinstance(arguments, dict) else None


def outcome_of(run: Run, tool: OfferedTool, arguments: dict, register: Callable[[concurrent.futures.Future], None]
               = lambda future: None) -> ToolOutcome:
    """Run one call to its outcome; a server's failure is the model's to read, never an exception."""
    try:
        future = run(tool.spec, arguments)
    except ToolServerError as exc:
        return ToolOutcome(exc.message, True, False)
    register(future)
    try:
        return future.result()
    except concurrent.futures.CancelledError:
        return ToolOutcome("the call was stopped", True, False)
    except ToolServerError as exc:
        return ToolOutcome(exc.message, True, False)
    except Exception as exc:  # noqa: BLE001 - the model is told, the reply goes on
        return ToolOutcome(f"the call failed: {exc}", True, False)


def run_approved(answers: Sequence[Approved], tools: Mapping[str, OfferedTool], run: Run,
                 take: Callable[[str, bool], bool]) -> Iterator[CallRunning | CallDone]:
    """Run the calls a request approves (before its turn starts: their outputs go into the first pass's prompt).
    Each answer is taken once (`take`, in the database): one taken before raises `AlreadyAnswered`, before
    anything runs. A denied call, or one whose tool is no longer offered, is not run."""
    for answer in answers:
        if not take(answer.approval_id, answer.approve):
            raise AlreadyAnswered(answer.approval_id)
    for answer in answers:
        tool = tools.get(answer.call.name)
        if not answer.approve or tool is None:
            continue
        yield CallRunning(answer.call, tool, answer.approval_id)
        arguments = arguments_of(answer.call)
        outcome = ToolOutcome(f"the arguments are not a JSON object: {answer.call.arguments[:200]!r}", True, False) \
            if arguments is None else outcome_of(run, tool, arguments)
        yield CallDone(answer.call, tool, outcome, "error" if outcome.is_error else "done", answer.approval_id)


def summed(records: Sequence[GenerationRecord]) -> GenerationRecord:
    """One record for a turn of several passes: what every pass read and wrote, the last one's end."""
    first, last = records[0], records[-1]
    return replace(last, text="".join(r.text for r in records), reasoning="".join(r.reasoning for r in records),
                   prompt_tokens=sum(r.prompt_tokens for r in records),
                   cached_tokens=sum(r.cached_tokens for r in records),
                   completion_tokens=sum(r.completion_tokens for r in records),
                   reasoning_tokens=sum(r.reasoning_tokens for r in records), queued_s=first.queued_s,
                   ttft_s=first.ttft_s, duration_s=sum(r.duration_s for r in records))


def _key(call: ToolCall) -> tuple[str, str]:
    """A call's name and arguments, the arguments' JSON read and written back (spacing and order aside)."""
    try:
        return call.name, json.dumps(json.loads(call.arguments or "{}"), sort_keys=True)
    except ValueError:
        return call.name, call.arguments


class ToolTurn:
    def __init__(self, start: Callable[[ChatRequest], Stream], ask: ChatRequest, tools: Mapping[str, OfferedTool],
                 run: Run, approvals: Approvals, *, steps: int, functions: frozenset[str] = frozenset(),
                 force_every_pass: bool = False, made: int = 0) -> None:
        self.tools, self.steps, self.functions = dict(tools), steps, functions
        self._start, self._run, self._approvals = start, run, approvals
        self._every_pass = force_every_pass
        self._made = made  # calls made so far in this turn
        self._asked: set[tuple[str, str]] = set()  # (name, arguments) of the calls made, to catch a repeat
        self._offer = ask.tools
        self._records: list[GenerationRecord] = []  # one per pass ended
        self._counted: Stream | None = None  # the last pass whose record is in
        self._cancelled = threading.Event()
        self._ended = threading.Event()
        self._lock = threading.Lock()
        self._running: concurrent.futures.Future | None = None
        self._watchers: list[Callable[[], None]] = []
        self._unwatch: list[Callable[[], None]] = []
        if made >= steps:
            ask = replace(ask, tools=None)
        self._messages = list(ask.messages)
        self._ask = ask
        self._limit = ask.params.max_new_tokens if ask.params is not None else None  # of the whole reply, every pass together (None: each its own)
        self._spent = False  # the limit ended the reply before its answer
        self._stream = self._begin(ask)  # the first pass starts now: its refusals are the caller's
        self.model = self._stream.model
        self.dropped_messages = self._stream.dropped_messages
        # its first pass's budget, as a stream's (serge.accounts.reservations holds it against the user's caps)
        self.prompt_tokens = self._stream.prompt_tokens
        self.prompt_bound = getattr(self._stream, "prompt_bound", None)  # a remote model's
        self.max_new_tokens = getattr(self._stream, "max_new_tokens", None)
        self.choices = 1

    # --- as a stream, for whoever meters, watches or stops it ----------------------------------
    @property
    def done(self) -> bool:
        return self._ended.is_set()

    @property
    def queue_position(self) -> int | None:
        return self._stream.queue_position

    @property
    def record(self) -> GenerationRecord:
        records = self._records or [self._stream.close()]
        combined = summed(records)
        if self._cancelled.is_set() and combined.finish_reason is not FinishReason.ERROR:
            combined = replace(combined, finish_reason=FinishReason.CANCELLED)
        elif self._spent and combined.finish_reason is FinishReason.STOP:
            combined = replace(combined, finish_reason=FinishReason.LENGTH)  # cut by the reply's max_new_tokens
        return combined

    @property
    def records(self) -> tuple[GenerationRecord, ...]:
        return (self.record,)

    def watch(self, wake: Callable[[], None]) -> Callable[[], None]:
        """`wake` on news of the pass running (its place in the queue) and at the turn's end."""
        with self._lock:
            self._watchers.append(wake)
            self._unwatch.append(self._stream.watch(wake))

        def unwatch() -> None:
            with self._lock:
                if wake in self._watchers:
                    self._watchers.remove(wake)
        return unwatch

    def cancel(self) -> None:
        self._cancelled.set()
        with self._lock:
            running = self._running
        self._stream.cancel()
        if running is not None:
            running.cancel()

    def close(self, timeout: float = 30.0) -> GenerationRecord:
        if not self._ended.is_set():
            self.cancel()
        self._stream.close(timeout)
        return self.record

    # --- the passes --------------------------------------------------------------------------------
    def events(self) -> Iterator[TurnEvent]:
        """The turn, pass by pass, to its end (`TurnEnded`); closing it early stops the turn."""
        try:
            while True:
                stream = self._stream
                yield PassStarted(stream)
                for delta in stream.deltas():
                    yield Generated(delta)
                record = self._count(stream)
                if not (yield from self._after(record)):
                    break
            yield TurnEnded(self.record)
        finally:
            if self._stream is not self._counted:  # stopped mid-pass: what it streamed is counted too
                self.cancel()
                self._count(self._stream)
            self._ended.set()
            with self._lock:
                watchers = tuple(self._watchers)
            for wake in watchers:
                wake()

    def _after(self, record: GenerationRecord) -> Iterator[TurnEvent]:
        """The calls of a pass, run or asked; returns whether another pass follows (started here)."""
        calls = record.tool_calls
        if self._cancelled.is_set() or not calls or record.finish_reason not in (FinishReason.STOP,
                                                                                 FinishReason.LENGTH):
            return False
        forced = self._ask.tools is not None and self._ask.tools.mode == "required"
        mine = [c for c in calls if c.name not in self.functions]
        if not forced and mine and all(_key(c) in self._asked for c in mine):
            # it asks again what it was just told (a small model's loop): it answers with that instead
            for call in mine:
                yield CallDone(call, self.tools.get(call.name), ToolOutcome(
                    "not run again: the same call was made before in this reply; its result is above", True,
                    False), "repeated")
            return self._next(None)
        self._asked.update(_key(c) for c in mine)
        results: list[Message] = []
        asked = False
        for call in mine:
            outcome = yield from self._call(call)
            if outcome is None:  # the client approves it first
                asked = True
                continue
            results.append(Message("tool", outcome.text, tool_call_id=call.id, name=call.name))
            if self._cancelled.is_set():
                return False
        if asked or len(mine) < len(calls):
            return False  # the client has a say: an approval to give, or its own function to run
        ran = tuple(c for c in mine)
        self._messages += [Message("assistant", record.text, tool_calls=ran), *results]
        return self._next(self._offer_after())

    def _offer_after(self) -> Tools | None:
        """What the next pass is offered: the tools again (forced only where every pass must call); none once the
        steps are spent."""
        if self._offer is None or self._made >= self.steps:
            return None
        return replace(self._offer, mode="required" if self._every_pass else "auto", name=None)

    def _next(self, tools: Tools | None) -> bool:
        """Start the next pass; False when the reply's `max_new_tokens` is spent (a limit on the whole reply,
        its passes together), or what is left of it is too short for the call the pass must make."""
        params = self._ask.params
        if self._limit is not None:
            left = self._limit - sum(r.completion_tokens for r in self._records)
            if left < 1:
                self._spent = True
                return False
            params = params.model_copy(update={"max_new_tokens": left})
        try:
            ask = replace(self._ask, messages=list(self._messages), tools=tools, params=params)
            self._stream = self._begin(ask)
        except InvalidRequest as exc:
            if exc.param != "max_tokens":
                raise
            self._spent = True
            return False
        self._ask = ask
        if self._cancelled.is_set():  # stopped while the pass was being started
            self._stream.cancel()
        return True

    def _count(self, stream: Stream) -> GenerationRecord:
        record = stream.close()
        self._records.append(record)
        self._counted = stream
        return record

    def _begin(self, ask: ChatRequest) -> Stream:
        stream = self._start(ask)
        with self._lock:
            for unwatch in self._unwatch:
                unwatch()
            self._unwatch = [stream.watch(wake) for wake in self._watchers]
        return stream

    def _call(self, call: ToolCall) -> Iterator[TurnEvent]:
        """One call: checked, approved, run; returns its outcome, or None when it ends the turn asking."""
        tool = self.tools.get(call.name)
        arguments = arguments_of(call)
        refused = None
        if tool is None:
            refused = f"there is no tool named {call.name!r}"
        elif arguments is None:
            refused = f"the arguments of {call.name!r} must be a JSON object"
        elif self._made >= self.steps:
            refused = f"not run: this reply made {self.steps} tool calls, the most it may (SERGE_TOOL_STEPS)"
        if refused is not None:
            outcome = ToolOutcome(refused, True, False)
            yield CallDone(call, tool, outcome, "error")
            return outcome
        if self._approvals.needed(tool):
            self._approvals.ask(call, tool)
            if not self._approvals.waits:
                yield ApprovalAsked(call, tool)
                return None
            yield ApprovalWanted(call, tool)
            allowed = self._approvals.wait(call, tool, self._cancelled)
            if not allowed:
                self._made += 1
                outcome = ToolOutcome("the call was stopped before the user answered", True, False) \
                    if allowed is None else \
                    ToolOutcome(f"the user denied this call of {tool.spec.name!r}; it did not run", True, False)
                yield CallDone(call, tool, outcome, "stopped" if allowed is None else "denied")
                return outcome
        yield CallRunning(call, tool)
        self._made += 1
        outcome = outcome_of(self._run, tool, arguments, self._track)
        with self._lock:
            self._running = None
        state = "stopped" if self._cancelled.is_set() else "error" if outcome.is_error else "done"
        yield CallDone(call, tool, outcome, state)
        return outcome

    def _track(self, future: concurrent.futures.Future) -> None:
        with self._lock:
            self._running = future
        if self._cancelled.is_set():
            future.cancel()
