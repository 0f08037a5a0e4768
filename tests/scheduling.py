"""The order test files are handed to pytest-xdist's workers: the costliest first, so that the two workers
finish together instead of one waiting on a long file begun last (`make test` runs `--dist loadfile
--no-loadscope-reorder`, which keeps this order; xdist's own orders files by their count of tests).

A file's cost is the sum of the seconds its tests to run now took when they last ran, kept per test in pytest's
cache (.pytest_cache), so `-m "not real_model"` weighs only the stand-in tests of a mixed file; a test the cache
has not seen (a fresh clone) is guessed: a few seconds on the real model, a tenth for the rest. The conftest
registers this module as a plugin.
"""

from __future__ import annotations

import pytest

KEY = "serge/test-seconds"
REAL_MODEL_TEST_S, STAND_IN_TEST_S = 4.0, 0.1  # the guesses; measured: ~2-60 s a real-model test, ~0.1 s the rest


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


@pytest.hookimpl(trylast=True)  # after the deselection by mark: only what runs counts
def pytest_collection_modifyitems(config, items):
    cache = getattr(config, "cache", None)  # None under -p no:cacheprovider
    measured = cache.get(KEY, {}) if cache is not None else {}
    cost: dict[str, float] = {}
    for item in items:
        guess = REAL_MODEL_TEST_S if item.get_closest_marker("real_model") else STAND_IN_TEST_S
        cost[file_of(item.nodeid)] = cost.get(file_of(item.nodeid), 0.0) + measured.get(item.nodeid, guess)
    items.sort(key=lambda item: -cost[file_of(item.nodeid)])  # stable: a file's tests keep their order


class Timer:
    """In the process that reports (the xdist controller, or the only one), each test's seconds (setup, call
    and teardown), saved at the end over the cache's earlier figures (a run of some tests leaves the others'
    as they were)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self, session) -> None:
        cache = getattr(session.config, "cache", None)
        if cache is not None and self.seconds:
            cache.set(KEY, {**cache.get(KEY, {}), **{k: round(v, 3) for k, v in self.seconds.items()}})


def register(config) -> None:
    """This module's hooks in every process; the timer only where reports arrive (not in an xdist worker)."""
    import sys

    config.pluginmanager.register(sys.modules[__name__], "serge-scheduling")
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(Timer(), "serge-scheduling-timer")
