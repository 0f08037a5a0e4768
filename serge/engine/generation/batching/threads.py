"""How many threads a model's passes run on: fewer while the machine is busy, back up when it is not.

A pass split over more threads than the cores free at that moment waits, at each of
its ~1,000 parallel regions, for a thread the OS has set aside: on a busy machine one
thread decodes many times faster than two, on an idle one two are faster (figures:
bench/README.md). So the count is not fixed:

- after each decode pass, the share of that pass's time the worker thread was on a
  CPU tells whether the machine is busy (about 1.0 idle, even while its helper
  threads spin at barriers; well under 1 when the OS kept it waiting);
- while busy, the next count down is tried for one pass; while not, and below the
  configured count, the next one up; the count tried is kept when its pass was clearly
  faster than the current count's recent passes of as many sequences, else dropped;
- a failed try waits twice as long before the next one that way (one slow pass each
  time at most, ever rarer while nothing changes): a worker that is often off its CPU
  on an idle machine (waiting at a barrier for its own helper threads) costs little.

Counts halve from the configured one (8, 4, 2, 1), and only counts the forward has
found to give every row the same bits are used (`Forward.thread_counts`), so a reply
is the same text whichever count ran which of its steps. The worker alone calls it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

BUSY = 0.8  # on a CPU for less than this share of a pass: the machine is busy
IDLE = 0.95  # for more: there may be room for more threads
GAIN = 0.8  # a count tried is kept when its pass took less than this share of the current count's
EVERY_S = 1.0  # seconds of passes between tries
MOST_WAIT_S = 64.0  # the longest wait after failed tries up
_SMOOTH = 0.3  # weight of the newest pass in the running means


def ladder(most: int) -> list[int]:
    """The counts tried, most first: halvings of `most` down to 1."""
    counts = [most]
    while counts[-1] > 1:
        counts.append(counts[-1] // 2)
    return counts


class Threads:
    """The worker's thread count, chosen pass by pass from `counts` (most first) and applied with `apply`."""

    def __init__(self, counts: list[int], apply: Callable[[int], None], report: Callable[[int], None] = lambda n: None,
                 clock: Callable[[], float] = time.perf_counter,
                 cpu_clock: Callable[[], float] = time.thread_time) -> None:
        self.counts = counts
        self._apply = apply
        self._report = report  # the count in use, whenever it changes (a metric)
        report(counts[0])
        self._clock, self._cpu_clock = clock, cpu_clock
        self._at = 0  # index into counts of the count in use
        self._mean: dict[int, float] = {}  # sequences in a pass -> smoothed seconds of a pass at the count in use
        self._share = 1.0  # smoothed share of a pass's time the worker was on a CPU
        self._worked = 0.0  # seconds of passes since the last try
        self._wait = {True: EVERY_S, False: EVERY_S}  # up?: seconds of passes before the next try that way
        self._pass, self._trying, self._started, self._cpu = 0, None, 0.0, 0.0  # the pass under way

    @property
    def current(self) -> int:
        return self.counts[self._at]

    def decode(self, sequences: int) -> Threads:
        """Around one decode pass of `sequences` sequences (`with threads.decode(n):`): maybe try another count
        for it, then learn from it. The worker's alone, one pass at a time: no generator made a pass."""
        self._pass = sequences
        return self

    def __enter__(self) -> None:
        self._trying = self._try(self._pass)
        if self._trying is not None:
            self._apply(self.counts[self._trying])
        self._started, self._cpu = self._clock(), self._cpu_clock()

    def __exit__(self, kind, exc, tb) -> None:
        seconds = self._clock() - self._started
        if self._trying is not None:
            self._judge(self._trying, self._pass, seconds if kind is None else None)
        elif kind is None:
            self._learn(self._pass, seconds, (self._cpu_clock() - self._cpu) / seconds if seconds > 0 else 1.0)

    def _try(self, sequences: int) -> int | None:
        if len(self.counts) == 1 or sequences not in self._mean:
            return None
        if self._share < BUSY and self._at + 1 < len(self.counts) and self._worked >= self._wait[False]:
            return self._at + 1
        if self._share > IDLE and self._at > 0 and self._worked >= self._wait[True]:
            return self._at - 1
        return None

    def _judge(self, trying: int, sequences: int, seconds: float | None) -> None:
        """Keep the count tried if its pass was clearly faster; else go back, and wait longer to try that way."""
        self._worked = 0.0
        up = trying < self._at
        if seconds is not None and seconds < GAIN * self._mean[sequences]:
            log.info("passes now run on %d thread(s), not %d: %s", self.counts[trying], self.current,
                     "the machine has room again" if up else "the machine is busy")
            self._at = trying
            self._report(self.current)
            self._mean = {sequences: seconds}
            self._wait = {True: EVERY_S, False: EVERY_S}
            return
        self._apply(self.current)
        self._wait[up] = min(2 * self._wait[up], MOST_WAIT_S)

    def _learn(self, sequences: int, seconds: float, share: float) -> None:
        self._worked += seconds
        mean = self._mean.get(sequences)
        self._mean[sequences] = seconds if mean is None else mean + _SMOOTH * (seconds - mean)
        self._share += _SMOOTH * (min(share, 1.0) - self._share)
