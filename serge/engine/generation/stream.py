"""One generation's lifecycle, as its consumer sees it.

A `Stream` is fed by the model's worker (`push`, `finish`) and read once by a
consumer, sync (`for text in stream`) or async (`async for`). Each piece of reply
text arrives exactly once; the prompt is never part of it. Beside the text, the
same queue carries what a caller may have asked for per token: its log-probability
(`TokenLogprob`) and, for a reply that calls tools, pieces of those calls
(`ToolCallDelta`); `deltas()` reads everything, in order, as `Delta`s, while plain
iteration yields only the text. A consumer that stops reading early, or calls
`cancel()`, makes the worker drop the sequence within a step; `close()` returns
only once the worker has let go of it. A request for n choices (OpenAI's `n`) is one
`Stream` of n sequences: each `Delta` says its `choice`, `records` has one record per
choice, and the stream ends, and `cancel()` reaches, all of them at once, so no path
can leave one choice running or unjoined.

The worker's wake-ups of async readers go through the scheduler's `Wakeups`, at most
one per event loop per step (see `wakeups`). Turning token ids into text is
`assembler.TextAssembler`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum

from serge.engine.generation.prompting.prompts import ToolCall
from serge.engine.generation.batching.wakeups import LoopWake, Wakeups


class FinishReason(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    CANCELLED = "cancelled"
    ERROR = "error"


@dataclass(frozen=True)
class TopLogprob:
    """One of the likeliest tokens at a step; `bytes` for a token that is not whole UTF-8 alone."""

    token: str
    logprob: float
    bytes: bytes


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token, its log-probability, and the most likely alternatives at its step."""

    token: str  # its text; bytes that are not whole UTF-8 characters are written as \\xNN
    logprob: float
    bytes: bytes  # exactly the token's bytes
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of the reply's `index`th tool call: the first carries its id and name, the rest arguments."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True)
class Delta:
    """What one push added: reply text, token log-probabilities, tool-call pieces (any may be empty)."""

    text: str = ""
    tokens: tuple[TokenLogprob, ...] = ()
    tool_calls: tuple[ToolCallDelta, ...] = ()
    reasoning: str = ""  # a thinking model's thoughts, apart from its answer
    choice: int = 0  # which of the request's n choices it belongs to

    def __bool__(self) -> bool:
        return bool(self.text or self.tokens or self.tool_calls or self.reasoning)


@dataclass(frozen=True)
class GenerationRecord:
    """What a finished generation produced and what it cost."""

    text: str  # the reply's text, without its tool calls
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    seed: int
    queued_s: float
    ttft_s: float | None
    duration_s: float
    reasoning: str = ""  # a thinking model's thoughts, apart from `text`
    reasoning_tokens: int = 0  # of completion_tokens, those written while it thought
    error: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    remote_error: bool = False  # the error was a remote model's server's (silent, hung up, refused), not Serge's
    busy: bool = False  # it never started: no slot came free within the queue's timeout (busy, not broken)
    stop_sequence: str | None = None  # the stop string that ended the reply, where the engine knows it
    cached_tokens: int = 0  # of prompt_tokens, those whose keys and values were reused (the prefix cache's)

    @property
    def tokens_per_s(self) -> float:
        decode = self.duration_s - (self.ttft_s or 0.0)
        if self.completion_tokens < 2 or decode <= 0:
            return 0.0
        return (self.completion_tokens - 1) / decode


class GenerationError(RuntimeError):
    """A generation failed; the message is safe to show to a user."""


_END = object()
CLOSE_TIMEOUT_S = 30.0  # longest wait for the worker to let go of a cancelled sequence


class Stream:
    """Deltas of one generation (of `choices` sequences), then its `records`."""

    def __init__(self, choices: int = 1, wakeups: Wakeups | None = None) -> None:
        self._deltas: queue.SimpleQueue = queue.SimpleQueue()
        self._cancelled = threading.Event()
        self._done = threading.Event()
        self.choices = choices
        self._records: list[GenerationRecord | None] = [None] * choices
        self._unfinished = choices
        # The prompt's tokens, where the engine counted them (set by the engine before anything is read).
        self.prompt_tokens: int | None = None
        self.created = time.monotonic()
        self._queue_position: int | None = None
        self._watchers: list[Callable[[], None]] = []  # each wakes a reader's event loop
        self._when_done: list[Callable[[], None]] | None = []  # None once they have been called
        self._when_done_lock = threading.Lock()
        self._wakeups = wakeups if wakeups is not None else Wakeups()  # the scheduler's: one per loop per step
        # Messages of the conversation left out of the prompt to fit the context (set by the engine).
        self.dropped_messages = 0
        self.model: str | None = None  # the name of the model that answers, set by the engine
        self.max_new_tokens: int | None = None  # each choice's longest reply, where the engine knows it
        self.prompt_bound: int | None = None  # where the prompt is not counted before it runs: an estimate of it

    # --- the worker's side -------------------------------------------------
    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def push(self, text: str = "", tokens: tuple[TokenLogprob, ...] = (),
             tool_calls: tuple[ToolCallDelta, ...] = (), reasoning: str = "", choice: int = 0) -> None:
        if text or tokens or tool_calls or reasoning:
            self._deltas.put(Delta(text, tokens, tool_calls, reasoning, choice))
            self._notify()

    def finish(self, record: GenerationRecord, choice: int = 0) -> None:
        """Called once per choice by the worker, after it has let go of that sequence; the stream
        ends with the last."""
        if self._records[choice] is not None:
            raise RuntimeError(f"choice {choice} finished twice")
        self._records[choice] = record
        self._unfinished -= 1
        if self._unfinished:
            return
        with self._when_done_lock:
            then, self._when_done = self._when_done, None
        for call in then:  # before the readers hear of the end: a lease ends before a client can ask again
            call()
        self._done.set()
        self._deltas.put(_END)
        self._notify()

    def when_done(self, call: Callable[[], None]) -> None:
        """Call `call` once, when the last choice has finished (now, if it has), before the stream reads as
        done: on the worker's thread, so it must be quick (the engine ends a reply's lease on its model with it)."""
        with self._when_done_lock:
            if self._when_done is not None:
                self._when_done.append(call)
                return
        call()

    @property
    def queue_position(self) -> int | None:
        """Requests ahead of this one in its model's queue (0: next in line); None once it runs."""
        return self._queue_position

    @queue_position.setter
    def queue_position(self, position: int | None) -> None:  # the scheduler's
        if position != self._queue_position:
            self._queue_position = position
            self._notify()

    def _notify(self) -> None:
        for wake in tuple(self._watchers):
            self._wakeups.wake(wake)

    def watch(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call `wake` (on the worker's thread; it must be quick) whenever there is news: text,
        the end, or a new place in the queue; during a step, once at its end. Returns the function that stops it."""
        self._watchers.append(wake)

        def unwatch() -> None:
            if wake in self._watchers:
                self._watchers.remove(wake)

        return unwatch

    # --- the consumer's side -----------------------------------------------
    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> GenerationRecord:
        """Stop the generation if it still runs, and wait until the worker lets go."""
        if not self._done.is_set():
            self.cancel()
        if not self._done.wait(timeout):
            raise GenerationError("the model worker did not release a cancelled generation")
        return self._records[0]

    @property
    def record(self) -> GenerationRecord:
        """The first choice's record: the only one unless n > 1."""
        return self.records[0]

    @property
    def records(self) -> tuple[GenerationRecord, ...]:
        """One per choice, in order."""
        if not self._done.is_set():
            raise RuntimeError("the stream has not finished; read it to the end or close() it")
        return tuple(self._records)

    def deltas(self) -> Iterator[Delta]:
        """Everything the generation pushes, in order (text, token log-probabilities, tool-call pieces)."""
        try:
            while (item := self._deltas.get()) is not _END:
                yield item
        finally:
            self.close()

    def __iter__(self) -> Iterator[str]:
        deltas = self.deltas()
        try:
            for delta in deltas:
                if delta.text:
                    yield delta.text
        finally:
            deltas.close()

    async def adeltas(self) -> AsyncIterator[Delta]:
        """`deltas()` for an event loop."""
        # The worker wakes this loop directly: no thread parked per reader, so many
        # streams cost the worker no extra contention for the GIL.
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        unwatch = self.watch(LoopWake(loop, ready))
        try:
            while True:
                try:
                    item = self._deltas.get_nowait()
                except queue.Empty:
                    ready.clear()
                    if self._deltas.empty():  # checked after clear(): a push since then sets it again
                        await ready.wait()
                    continue
                if item is _END:
                    return
                yield item
        finally:
            if not self._done.is_set():  # the reader left early: stop, and wait here until the worker lets go
                self.cancel()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(CLOSE_TIMEOUT_S):
                        while not self._done.is_set():  # `finish` sets it, then wakes this loop
                            ready.clear()
                            if not self._done.is_set():
                                await ready.wait()
            unwatch()
            self.close(timeout=0)  # the record is in, or GenerationError as `close()` gives it

    async def __aiter__(self) -> AsyncIterator[str]:
        deltas = self.adeltas()
        try:
            async for delta in deltas:
                if delta.text:
                    yield delta.text
        finally:
            await deltas.aclose()

    def text(self) -> str:
        """Read to the end and return the whole reply."""
        for _ in self:
            pass
        return self.record.text
