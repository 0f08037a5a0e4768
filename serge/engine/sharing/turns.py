"""Turns on one model between parties: one piece of work at a time, round robin between who asks.

An embedding model runs one batch at a time on its callers' threads. A request's texts are split
into batches and each batch takes a turn (`Turns.turn(party)`): the turn goes to the party whose
last turn is longest ago (one that has had none first), and within a party in the order asked. So
a request of 2,048 texts is 64 turns, and another party's one-line request runs after at most one
of them, not after all; a party's inputs count as the batches they are. It knows nothing of models
or of who a party is (`party`); a turn that raises gives its place up all the same.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

REMEMBERED = 1024  # parties whose last turn is kept; one forgotten counts as having had none


class Turns:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._waiting: dict[str, deque[int]] = {}  # per party, its tickets in order asked; never an empty one
        self._last: dict[str, int] = {}  # the number of each party's last turn (the most recent REMEMBERED)
        self._tickets = itertools.count()
        self._turns = itertools.count(1)
        self._busy = False

    @contextmanager
    def turn(self, party: str) -> Iterator[None]:
        """Wait for `party`'s turn, hold it for the block, then hand it to the next."""
        with self._cond:
            ticket = next(self._tickets)
            self._waiting.setdefault(party, deque()).append(ticket)
            while self._busy or self._next() != (party, ticket):
                self._cond.wait()
            self._busy = True
            self._waiting[party].popleft()
            if not self._waiting[party]:
                del self._waiting[party]
        try:
            yield
        finally:
            with self._cond:
                self._busy = False
                self._last[party] = next(self._turns)
                if len(self._last) > REMEMBERED:  # those not waiting, oldest first, are forgotten
                    for gone in sorted((p for p in self._last if p not in self._waiting), key=self._last.get):
                        if len(self._last) <= REMEMBERED // 2:
                            break
                        del self._last[gone]
                self._cond.notify_all()

    def _next(self) -> tuple[str, int]:
        party = min(self._waiting, key=lambda p: (self._last.get(p, 0), self._waiting[p][0]))
        return party, self._waiting[party][0]
