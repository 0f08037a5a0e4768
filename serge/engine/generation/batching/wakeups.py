"""Waking the readers of streams: each event loop at most once per scheduler step, however many of its streams have news.

A reader on an event loop waits on an `asyncio.Event` that the worker sets through
`loop.call_soon_threadsafe`. Each such call writes to the loop's wake-up pipe, and the
loop's thread then takes the GIL and a core, while llama.cpp's threads spin mid-pass on
every core they were given: with 8 streams on one server loop, 8 wake-ups a step. So the
worker holds the wake-ups of a step (`Wakeups.held()`) and, at its end, makes one call per
loop that sets every event with news; a step that runs prompt passes after its decode sends
what it holds before each of them (`send()`), so a first token or a decoded one is not kept
waiting behind a prompt's pass: at most one wake-up per loop per pass. Outside a held step
(the worker idle, another thread queuing a request) a wake-up goes out at once.

It knows nothing of what the news is: that is `stream.Stream`'s.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial


class LoopWake:
    """An async reader's wake-up: the event it awaits, set on its own loop."""

    __slots__ = ("event", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
        self.loop, self.event = loop, event

    def __call__(self) -> None:
        self.loop.call_soon_threadsafe(self.event.set)


def _set_all(events: tuple[asyncio.Event, ...]) -> None:
    for event in events:
        event.set()


def _quietly(call: Callable[[], None]) -> None:
    try:
        call()
    except RuntimeError:  # the reader's event loop has closed
        pass


class Wakeups:
    """One scheduler's wake-ups, held while its worker runs a step."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held = False
        self._loops: dict[asyncio.AbstractEventLoop, dict[asyncio.Event, None]] = {}  # ordered sets, under _lock
        self._calls: dict[Callable[[], None], None] = {}  # other watchers (a sync caller's), under _lock

    def wake(self, watcher: Callable[[], None]) -> None:
        """Call `watcher` now, or once at the end of the step being held."""
        with self._lock:
            if self._held:
                if isinstance(watcher, LoopWake):
                    self._loops.setdefault(watcher.loop, {})[watcher.event] = None
                else:
                    self._calls[watcher] = None
                return
        _quietly(watcher)

    @contextmanager
    def held(self) -> Iterator[None]:
        """The worker's step: wake-ups asked for inside it go out, one per loop, when it ends."""
        with self._lock:
            self._held = True
        try:
            yield
        finally:
            with self._lock:
                self._held = False
            self.send()

    def send(self) -> None:
        """Send the wake-ups held so far, one per loop (the step goes on holding what comes next)."""
        with self._lock:
            loops, self._loops = self._loops, {}
            calls, self._calls = self._calls, {}
        for loop, events in loops.items():
            _quietly(partial(loop.call_soon_threadsafe, _set_all, tuple(events)))
        for call in calls:
            _quietly(call)
