"""A chat reply that may call tools: model, tool, model again, up to SERGE_TOOL_STEPS calls a reply.

`ToolLoop` stands where the engine's `Stream` stands for a `Reply` (the same verbs:
deltas, close, cancel, watch, done, records), so a reply with tools is saved, listened to
and stopped as any other. Each step is one generation offered the chat's tools. When the
model calls one, the call is shown as it happens (a `ToolDelta`, folded into the reply by
the page); a tool that is not read-only waits for the user's Allow or Deny unless the chat
always allows it; it runs through `serge.tools.ToolServers` (or Serge's own knowledge
search), and its result goes back to the model as a tool message: text, which the engine
never reads as control tokens. Once the calls are spent, or when the model (not forced to) asks for
a call it made already, it answers without tools.
It runs on the reply's thread; a Stop ends the generation, the wait and the call in flight.
It does not decide which tools a chat may use (the chat service does) nor run MCP sessions.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from serge.engine import ChatRequest, Engine, FinishReason, GenerationRecord, Message, SamplingParams, Tool, Tools
from serge.tools import ToolOutcome, ToolServerError, ToolSpec

KNOWLEDGE_SERVER = "serge"  # the server name shown for Serge's own `search_knowledge`
APPROVAL_WAIT_S = 900.0  # a call nobody allows or denies in this time is denied
MAX_ARGUMENT_CHARS = 100_000


@dataclass(frozen=True)
class ToolDelta:
    """A change to one call of the reply (`tool`: its stored entry), read by `Reply` beside text deltas."""

    tool: dict
    text: str = ""
    reasoning: str = ""


def function_names(specs: Sequence[ToolSpec]) -> dict[str, ToolSpec]:
    """The name the model calls each tool by: its own, or `server_tool` where two servers share a name."""
    counts: dict[str, int] = {}
    for spec in specs:
        counts[spec.name] = counts.get(spec.name, 0) + 1
    named = {}
    for spec in specs:
        name = spec.name if counts[spec.name] == 1 else f"{spec.server}_{spec.name}"
        named[name[:64]] = spec
    return named


def _key(call) -> tuple[str, str]:
    """A call's name and arguments, the arguments' JSON read and written back (spacing and order aside)."""
    try:
        arguments = json.dumps(json.loads(call.arguments or "{}"), sort_keys=True)
    except ValueError:
        arguments = call.arguments
    return call.name, arguments


class ToolLoop:
    def __init__(self, engine: Engine, model: str, messages: Sequence[Message], params: SamplingParams,
                 offered: dict[str, ToolSpec], run: Callable[[ToolSpec, dict], concurrent.futures.Future], *,
                 steps: int, choice: str = "auto", always: frozenset[str] = frozenset(),
                 remember: Callable[[str], None] = lambda key: None, wait_s: float = 60.0) -> None:
        self._engine, self._model, self._params = engine, model, params
        self._messages = list(messages)
        self._offered, self._run, self._steps, self._choice = offered, run, steps, choice
        self._always, self._remember, self._wait_s = set(always), remember, wait_s
        self.tool_log: list[dict] = []  # each call, as stored with the message
        self._made = 0  # calls made so far
        self._asked: set[tuple[str, str]] = set()  # (name, arguments) of the calls made, to catch a repeat
        self._forced = False  # the step running must call a tool
        self._records: list[GenerationRecord] = []
        self._cancelled = threading.Event()
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._decisions: dict[str, tuple[threading.Event, list]] = {}  # call id -> (decided, [allow, always])
        self._running: concurrent.futures.Future | None = None
        self._watchers: list[Callable[[], None]] = []
        self._unwatch: list[Callable[[], None]] = []
        self._current = self._generate()  # the first generation starts now: its errors are the caller's
        self.dropped_messages = self._current.dropped_messages
        self.model = self._current.model

    # --- what Reply and the web layer read, as of a Stream -------------------------
    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def queue_position(self) -> int | None:
        return self._current.queue_position

    @property
    def records(self) -> tuple[GenerationRecord, ...]:
        return (self._record(),)

    def watch(self, wake: Callable[[], None]) -> Callable[[], None]:
        self._watchers.append(wake)
        self._unwatch.append(self._current.watch(wake))

        def unwatch() -> None:
            if wake in self._watchers:
                self._watchers.remove(wake)
        return unwatch

    def cancel(self) -> None:
        self._cancelled.set()
        with self._lock:
            running = self._running
            waits = [event for event, _ in self._decisions.values()]
        self._current.cancel()
        if running is not None:
            running.cancel()
        for event in waits:
            event.set()

    def close(self, timeout: float = 30.0) -> GenerationRecord:
        if not self._done.is_set():
            self.cancel()
        self._current.close(timeout)
        return self._record()

    def decide(self, call_id: str, allow: bool, always: bool = False) -> bool:
        """The user's answer to a call waiting for approval; False when no call of that id waits."""
        with self._lock:
            waiting = self._decisions.get(call_id)
        if waiting is None or waiting[0].is_set():
            return False
        waiting[1][:] = [allow, always]
        waiting[0].set()
        return True

    # --- the loop, on the reply's thread ---------------------------------------------
    def deltas(self):
        try:
            for note in list(self.tool_log):  # servers that could not be reached, said first
                yield ToolDelta(dict(note))
            while True:
                for delta in self._current.deltas():
                    if delta.text or delta.reasoning:
                        yield delta
                record = self._current.close()
                self._records.append(record)
                calls = record.tool_calls[:max(0, self._steps - self._made)]
                if self._cancelled.is_set() or not calls:
                    return
                if not self._forced and all(_key(c) in self._asked for c in calls):
                    # it asks again what it was just told (a small model's loop): it answers with that instead
                    self._made = self._steps
                    self._current = self._generate()
                    continue
                self._asked.update(_key(c) for c in calls)
                self._messages.append(Message("assistant", record.text, tool_calls=tuple(calls)))
                for call in calls:
                    yield from self._call(call)
                    if self._cancelled.is_set():
                        return
                self._current = self._generate()
        finally:
            self._done.set()

    def _generate(self):
        left = self._steps - self._made
        tools, self._forced = None, False
        if self._offered and left > 0:
            must = self._choice == "always" or (self._choice == "first" and not self._made)
            self._forced = must
            tools = Tools(tuple(Tool(name, spec.description[:4000], json.dumps(spec.input_schema))
                                for name, spec in self._offered.items()),
                          "required" if must else "auto", parallel=False)
        stream = self._engine.chat(self._model, ChatRequest(self._messages, self._params, tools=tools))
        for unwatch in self._unwatch:
            unwatch()
        self._unwatch = [stream.watch(wake) for wake in self._watchers]
        return stream

    def _call(self, call):
        spec = self._offered.get(call.name)
        entry = {"id": call.id, "server": spec.server if spec else "", "tool": spec.name if spec else call.name,
                 "arguments": call.arguments[:MAX_ARGUMENT_CHARS], "state": "running", "result": "",
                 "is_error": False, "cut": False}
        self.tool_log.append(entry)
        self._made += 1
        outcome = None
        try:
            arguments = json.loads(call.arguments or "{}")
        except ValueError:
            arguments = None
        if spec is None:
            outcome = ToolOutcome(f"there is no tool named {call.name!r}", True, False)
        elif not isinstance(arguments, dict):
            outcome = ToolOutcome(f"the arguments of {call.name!r} must be a JSON object", True, False)
        elif not spec.read_only and (key := f"{spec.server}/{spec.name}") not in self._always:
            entry["state"] = "waiting"
            yield ToolDelta(dict(entry))
            allowed = self._approval(call.id, key)
            if allowed is None:
                outcome = ToolOutcome("the call was stopped before the user answered", True, False)
                entry["state"] = "stopped"
            elif not allowed:
                outcome = ToolOutcome(f"the user denied this call of {spec.name!r}; it did not run", True, False)
                entry["state"] = "denied"
            else:
                entry["state"] = "running"
        if outcome is None:
            yield ToolDelta(dict(entry))
            outcome = self._execute(spec, arguments)
            entry["state"] = "stopped" if self._cancelled.is_set() else "error" if outcome.is_error else "done"
        entry.update(result=outcome.text, is_error=outcome.is_error, cut=outcome.cut)
        if entry["state"] == "running":
            entry["state"] = "error"
        yield ToolDelta(dict(entry))
        self._messages.append(Message("tool", outcome.text, tool_call_id=call.id, name=call.name))

    def _approval(self, call_id: str, key: str) -> bool | None:
        """True (allowed), False (denied, or unanswered in time), None (the reply was stopped)."""
        event, answer = threading.Event(), []
        with self._lock:
            self._decisions[call_id] = (event, answer)
        if self._cancelled.is_set():
            return None
        event.wait(self._wait_s)
        with self._lock:
            self._decisions.pop(call_id, None)
        if self._cancelled.is_set():
            return None
        if not answer:
            return False
        allow, always = answer
        if allow and always:  # this chat runs the tool without asking from now on
            self._always.add(key)
            try:
                self._remember(key)
            except Exception:  # noqa: BLE001 - the call runs; only the next reply asks again
                pass
        return bool(allow)

    def _execute(self, spec: ToolSpec, arguments: dict) -> ToolOutcome:
        try:
            future = self._run(spec, arguments)
        except ToolServerError as exc:
            return ToolOutcome(exc.message, True, False)
        with self._lock:
            self._running = future
        if self._cancelled.is_set():
            future.cancel()
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            return ToolOutcome("the call was stopped", True, False)
        except ToolServerError as exc:
            return ToolOutcome(exc.message, True, False)
        except Exception as exc:  # noqa: BLE001 - the model is told, the reply goes on
            return ToolOutcome(f"the call failed: {exc}", True, False)
        finally:
            with self._lock:
                self._running = None

    def _record(self) -> GenerationRecord:
        records = self._records or [self._current.close()]
        first, last = records[0], records[-1]
        combined = replace(
            last, text="".join(r.text for r in records), reasoning="".join(r.reasoning for r in records),
            prompt_tokens=first.prompt_tokens, completion_tokens=sum(r.completion_tokens for r in records),
            reasoning_tokens=sum(r.reasoning_tokens for r in records), queued_s=first.queued_s, ttft_s=first.ttft_s,
            duration_s=sum(r.duration_s for r in records), tool_calls=())
        if self._cancelled.is_set() and combined.finish_reason != FinishReason.ERROR:
            combined = replace(combined, finish_reason=FinishReason.CANCELLED)
        return combined
