"""How much one model's scheduler takes on at once, and the answer when it is full.

`SchedulerLimits` is read from the settings once per load; `EngineBusy` is what `Scheduler.submit`
raises when every slot and the queue are taken (the web layer makes it a 503 with Retry-After).
It knows nothing of sequences or forwards: that is `scheduler`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
