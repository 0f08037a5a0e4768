"""Per-user budgets: requests per minute and replies generating at once.

`UserLimits` belongs to one app (no module state, no Redis). Requests other
than model requests are metered in this process by a token bucket (a burst of a
minute's worth, then a steady rate): a flood guard, so the wait it names in
Retry-After is exact; model requests are counted by their quota, in the database
(`serge.accounts.reservations`). Replies generating
are counted here too, until `share_streams` hands the count to the database
several processes share (`SharedReplies`): then a user has their streams once
across all of them. It knows nothing of HTTP.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

MAX_BUCKETS = 10_000  # past this many callers, buckets that have refilled are dropped


class SharedStreams(Protocol):
    def open_stream(self, user_id: str, limit: int) -> str | None: ...
    def close_stream(self, stream_id: str) -> None: ...


@dataclass
class _Bucket:
    tokens: float
    stamp: float


class UserLimits:
    def __init__(self, max_streams: int, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_streams = max_streams
        self.per_minute = per_minute
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._streams: dict[str, int] = {}
        self._shared: SharedStreams | None = None
        self._lock = threading.Lock()

    def share_streams(self, shared: SharedStreams) -> None:
        """From now on, count replies generating in the database every process shares."""
        self._shared = shared

    @property
    def streams_in_database(self) -> bool:
        """Whether opening and closing a stream is a database call (to run off the event loop)."""
        return self._shared is not None

    def take(self, key: str, per_minute: int | None = None) -> int:
        """Spend one request of `key`'s budget: 0 when allowed, else the seconds until the next one is."""
        rate = per_minute or self.per_minute
        with self._lock:
            now = self._clock()
            bucket = self._buckets.get(key)
            if bucket is None:
                if len(self._buckets) >= MAX_BUCKETS:
                    self._forget_full(now)
                bucket = self._buckets[key] = _Bucket(float(rate), now)
            bucket.tokens = min(float(rate), bucket.tokens + (now - bucket.stamp) * rate / 60)
            bucket.stamp = now
            if bucket.tokens >= 1:
                bucket.tokens -= 1
                return 0
            return max(1, math.ceil((1 - bucket.tokens) * 60 / rate))

    def refund(self, key: str, per_minute: int | None = None) -> None:
        """Give back one request (a login that succeeded costs nothing)."""
        with self._lock:
            if bucket := self._buckets.get(key):
                bucket.tokens = min(float(per_minute or self.per_minute), bucket.tokens + 1)

    def _forget_full(self, now: float) -> None:
        # A bucket refills to at most a minute's worth, so one untouched for a minute is as good as new.
        for key in [k for k, b in self._buckets.items() if now - b.stamp >= 60]:
            del self._buckets[key]

    def open_stream(self, key: str) -> str | None:
        """Count a reply of `key` as generating: a handle for `close_stream`, or None (nothing counted) when
        they already have the most."""
        if self._shared is not None:
            return self._shared.open_stream(key, self.max_streams)
        with self._lock:
            running = self._streams.get(key, 0)
            if running >= self.max_streams:
                return None
            self._streams[key] = running + 1
            return key

    def close_stream(self, handle: str) -> None:
        if self._shared is not None:
            return self._shared.close_stream(handle)
        with self._lock:
            running = self._streams.get(handle, 0) - 1
            if running > 0:
                self._streams[handle] = running
            else:
                self._streams.pop(handle, None)
