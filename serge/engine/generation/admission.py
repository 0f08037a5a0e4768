"""How much one model's scheduler takes on at once, the queue of what waits, and the answer when it is full.

`SchedulerLimits` is read from the settings once per load; `EngineBusy` is what `Scheduler.submit`
raises when every slot and the queue are taken (the web layer makes it a 503 with Retry-After);
`Waiting` decides which waiting requests start, whole and in order. It knows nothing of forwards
or sampling: that is `scheduler`'s.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from serge.engine.generation.stream import FinishReason

if TYPE_CHECKING:
    from serge.engine.generation.sequence import Sequence


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
    """The requests not yet running, each as its n choices, oldest first; used under the scheduler's lock.

    A request is admitted whole (all its choices at once) and in its turn, so one for n is never
    starved by smaller ones behind it; a reply put back for want of KV room goes first and never
    times out."""

    def __init__(self, timeout_s: float) -> None:
        self._groups: deque[list[Sequence]] = deque()
        self._timeout = timeout_s

    def __len__(self) -> int:
        return len(self._groups)

    @property
    def sequences(self) -> int:
        return sum(map(len, self._groups))

    def add(self, group: list[Sequence], running: int, max_running: int, max_queue: int, mean_s: float) -> int:
        """Queue a request and give its place, or raise EngineBusy when every slot and the queue are taken
        (Retry-After from the mean reply's `mean_s`)."""
        waiting = len(self._groups)
        if running + self.sequences + len(group) > max_running + max_queue:
            retry = min(300.0, max(1.0, mean_s * (waiting + 1) / max_running))
            raise EngineBusy(retry, f"the server is busy: {running} replies are running and {waiting} waiting; "
                                    f"try again in {retry:.0f} s")
        self._groups.append(group)
        return waiting

    def put_back(self, group: list[Sequence]) -> None:
        self._groups.appendleft(group)

    def admit(self, free: int, now: float) -> tuple[list[Sequence], list[tuple[Sequence, FinishReason, str | None]]]:
        """Take requests while `free` slots last; drop cancelled and timed-out ones (with why)."""
        admitted, expired, kept = [], [], deque()
        for group in self._groups:
            stream = group[0].stream
            waited = now - stream.created
            if stream.cancelled:
                expired += [(seq, FinishReason.CANCELLED, None) for seq in group]
            elif not kept and len(admitted) + len(group) <= free:
                admitted += group
            elif waited > self._timeout and group[0].started is None:
                error = f"timed out after {waited:.0f} s waiting for a free slot; the server is busy"
                expired += [(seq, FinishReason.ERROR, error) for seq in group]
            else:
                kept.append(group)
        self._groups = kept
        for position, group in enumerate(kept):
            group[0].stream.queue_position = position
        return admitted, expired

    def drain(self) -> list[Sequence]:
        """Everything still waiting, taken out (at close)."""
        left = [seq for group in self._groups for seq in group]
        self._groups.clear()
        return left
