"""How much one model's scheduler takes on at once, the queue of what waits, and the answer when it is full.

`SchedulerLimits` is read from the settings once per load; `EngineBusy` is what `Scheduler.submit`
raises when every slot and the queue are taken (the web layer makes it a 503 with Retry-After);
`Waiting` decides which waiting requests start, whole, in order within a party and fairly between
parties (who asked: an opaque name the engine's callers give), and which party gives a slot back when
another waits under its share. It knows nothing of forwards or sampling, nor of who a party is: that is
`scheduler`'s, and the caller's.
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from serge.engine.generation.stream import FinishReason

if TYPE_CHECKING:
    import torch  # extra: transformers

    from serge.engine.generation.batching.sequence import Sequence


class EngineBusy(RuntimeError):
    """Every slot is taken and the queue is full; try again after `retry_after_s`."""

    def __init__(self, retry_after_s: float, message: str = "the server is busy; try again later") -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class SchedulerLimits:
    """How much one model's scheduler takes on at once."""

    max_running: int | None = None  # None: see `running_for`
    max_queue: int = 64
    queue_timeout_s: float = 120.0
    prefix_cache_mb: int = 512
    prefill_chunk: int = 256

    def running_for(self, device: torch.device) -> int:
        return self.max_running or (64 if device.type == "cuda" else 16)

    @classmethod
    def from_settings(cls, settings) -> SchedulerLimits:
        return cls(
            max_running=settings.max_running,
            max_queue=settings.max_queue,
            queue_timeout_s=settings.queue_timeout_s,
            prefix_cache_mb=settings.prefix_cache_mb,
            prefill_chunk=settings.prefill_chunk,
        )


class Waiting:
    """The requests not yet running, each as its n choices, in a queue per party; used under the scheduler's lock.

    A party is who asked (an opaque name, "" for the engine's own callers). Slots go to parties fairly:
    the next request to start is the oldest of the party that holds the fewest slots (the scheduler says
    who holds how many at each step; between equals, the party admitted longest ago: round robin), so a
    party's n choices count as the n slots they take, and one party's queue never delays another's. A request is
    admitted whole and in its turn: when the request whose turn it is does not fit, none starts behind
    it, so one for n is never starved by smaller ones. A reply put back (for want of KV room, or to give a
    slot to a party under its share) goes first in its party's queue and never times out.
    `over_share` says which parties hold more than their share of the slots while another waits."""

    def __init__(self, timeout_s: float) -> None:
        self._queues: dict[str, deque[list[Sequence]]] = {}  # per party, oldest first; never an empty one
        self._holding: Counter[str] = Counter()  # slots per party at the last admission
        self._last: dict[str, int] = {}  # when each party holding or waiting was last admitted (a count)
        self._admissions = itertools.count(1)
        self._timeout = timeout_s

    def __len__(self) -> int:
        return sum(map(len, self._queues.values()))

    @property
    def sequences(self) -> int:
        return sum(len(group) for queue in self._queues.values() for group in queue)

    def add(self, group: list[Sequence], running: int, max_running: int, max_queue: int, mean_s: float) -> int:
        """Queue a request and give its place, or raise EngineBusy when every slot and the queue are taken
        (Retry-After from the mean reply's `mean_s`)."""
        waiting = len(self)
        if running + self.sequences + len(group) > max_running + max_queue:
            retry = min(300.0, max(1.0, mean_s * (waiting + 1) / max_running))
            raise EngineBusy(retry, f"the server is busy: {running} replies are running and {waiting} waiting; "
                                    f"try again in {retry:.0f} s")
        self._queues.setdefault(group[0].party, deque()).append(group)
        return next(i for i, g in enumerate(self._order(self._holding)) if g is group)

    def put_back(self, group: list[Sequence]) -> None:
        self._queues.setdefault(group[0].party, deque()).appendleft(group)

    def admit(self, free: int, now: float, holding: Mapping[str, int]
              ) -> tuple[list[Sequence], list[tuple[Sequence, FinishReason, str | None]]]:
        """Take requests in their fair turn while `free` slots last (`holding`: the slots each party holds);
        drop cancelled and timed-out ones (with why)."""
        expired: list[tuple[Sequence, FinishReason, str | None]] = []
        for queue in self._queues.values():
            for group in [g for g in queue if g[0].stream.cancelled]:
                queue.remove(group)
                expired += [(seq, FinishReason.CANCELLED, None) for seq in group]
        counts = Counter(holding)
        admitted: list[Sequence] = []
        for group in self._order(holding):
            if len(group) > free:
                break
            self._queues[group[0].party].popleft()  # the turn is always a queue's first
            admitted += group
            free -= len(group)
            counts[group[0].party] += len(group)
            self._last[group[0].party] = next(self._admissions)
        for queue in self._queues.values():
            for group in list(queue):
                waited = now - group[0].stream.created
                if waited > self._timeout and group[0].started is None:
                    queue.remove(group)
                    error = f"timed out after {waited:.0f} s waiting for a free slot; the server is busy"
                    expired += [(seq, FinishReason.ERROR, error) for seq in group]
        self._queues = {party: queue for party, queue in self._queues.items() if queue}
        self._holding = counts
        self._last = {p: n for p, n in self._last.items() if counts[p] or p in self._queues}
        for position, group in enumerate(self._order(counts)):
            if group[0].started is None:  # a reply put back is running to its reader: it has no place
                group[0].stream.queue_position = position
        return admitted, expired

    def over_share(self, holding: Mapping[str, int], max_running: int, free: int) -> dict[str, int]:
        """How many of their slots parties give back now (`{party: slots}`) so that the request whose turn it
        is can start: only when its party stays within its share (the slots over the parties running or
        waiting), and only from parties left holding their share at least, the most laden first. Empty
        when that request fits already, or no one holds more than their share."""
        turn = next(iter(self._order(holding)), None)
        if turn is None or len(turn) <= free:
            return {}
        parties = {party for party, n in holding.items() if n} | set(self._queues)
        share = max_running / len(parties)
        party = turn[0].party
        if holding.get(party, 0) + len(turn) > share:
            return {}
        counts, given, need = Counter(holding), Counter(), len(turn) - free
        while need > 0:
            laden = max((p for p in counts if p != party), key=lambda p: counts[p], default=None)
            if laden is None or counts[laden] - 1 < share:
                return {}
            counts[laden] -= 1
            given[laden] += 1
            need -= 1
        return dict(given)

    def drain(self) -> list[Sequence]:
        """Everything still waiting, taken out (at close)."""
        left = [seq for queue in self._queues.values() for group in queue for seq in group]
        self._queues.clear()
        return left

    def _order(self, holding: Mapping[str, int]) -> list[list[Sequence]]:
        """Every waiting request in the order the slots would go to them: each time, the first of the party
        holding the fewest (counting what goes to it before), ties to the party admitted longest ago (one
        never admitted first), then to the request waiting longest: round robin between equals."""
        counts, last, at, order = Counter(holding), dict(self._last), dict.fromkeys(self._queues, 0), []
        while True:
            heads = [(counts[p], last.get(p, 0), q[at[p]][0].stream.created, p)
                     for p, q in self._queues.items() if at[p] < len(q)]
            if not heads:
                return order
            party = min(heads)[-1]
            group = self._queues[party][at[party]]
            at[party] += 1
            counts[party] += len(group)
            last[party] = max(last.values(), default=0) + 1
            order.append(group)
