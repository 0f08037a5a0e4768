"""uvicorn's server, with a drain before it stops listening on SIGTERM.

A balancer learns that a process is going only from its health checks. Closed at once, the port
resets a connection the kernel had just accepted for it, and that request fails (a 502 from
HAProxy, which retries only a connection refused). So for `drain_s` seconds `/api/health`
answers 503 while every request is still served; then the server stops as uvicorn does
(no new connections, replies in progress finish). Ctrl-C, or a second SIGTERM, stops at once.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from types import FrameType

import uvicorn

log = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, drain_s: float, on_drain: Callable[[], None]) -> None:
        super().__init__(config)
        self._drain_s, self._on_drain = drain_s, on_drain
        self._drain_ends: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and self._drain_s > 0 and self._drain_ends is None:
            self._drain_ends = time.monotonic() + self._drain_s
            self._on_drain()
            log.info("SIGTERM: /api/health answers 503 for %.1f s while requests are still served, then Serge stops",
                     self._drain_s)
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        """Every 0.1 s, in uvicorn's main loop."""
        if self._drain_ends is not None and not self.should_exit and time.monotonic() >= self._drain_ends:
            super().handle_exit(signal.SIGTERM, None)  # uvicorn raises it again once stopped, as for any signal
        return await super().on_tick(counter)
