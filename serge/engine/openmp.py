"""Work that may start OpenMP threads, run on a thread whose OpenMP threads end with it.

libgomp (torch's runtime) counts the helper threads of every OpenMP team in the process, and
a team lives as long as the thread that started it. Once that count passes the CPUs, every
team's barriers spin ~100 times instead of ~300,000 before they sleep: a chat on llama.cpp
built with OpenMP decoded 1.32-1.39x slower after three `/v1/embeddings` calls had run torch
on a thread of the server's pool (figures: bench/README.md). llama.cpp is built without
it (`llamacpp/threadpool.py`), but the transformers engine's passes are torch's. So a model's
worker ends its team whenever it goes idle (`end_team`: a transformers model decoded 1.22x
slower while a second one sat loaded and idle), and other work that may run torch on several
threads runs here: a model's load on a thread of its own, an embedding model's batches on a
thread that ends once it has had nothing to do for `IDLE_S` (a fresh thread's first batch
costs its per-thread set-up again: one text at a time ran at about half the rate).
"""

from __future__ import annotations

import collections
import contextvars
import ctypes
import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

IDLE_S = 0.5  # seconds without work before a `PassingThread` ends, and its OpenMP team with it
OMP_PAUSE_SOFT = 1  # omp.h's omp_pause_resource_t


@functools.cache
def _libgomp() -> ctypes.CDLL | None:
    """torch's OpenMP runtime on Linux; None elsewhere (macOS's libomp keeps no such count of threads)."""
    import torch

    path = Path(torch.__file__).parent / "lib" / "libgomp.so.1"
    return ctypes.CDLL(str(path)) if path.exists() else None


def end_team() -> None:
    """End the OpenMP team this thread started: its helpers exit, and the next parallel region starts
    another (tens of microseconds). OpenMP 5's omp_pause_resource_all, which libgomp carries out for the
    calling thread's team alone."""
    if (libgomp := _libgomp()) is not None:
        libgomp.omp_pause_resource_all(OMP_PAUSE_SOFT)


def on_own_thread(work: Callable[[], T], name: str = "serge-openmp") -> T:
    """`work()` on a thread made for it (with the caller's context variables), its result or its exception
    here; the thread, and any OpenMP team it started, ends before this returns (the executor joins it)."""
    with ThreadPoolExecutor(1, thread_name_prefix=name) as thread:
        return thread.submit(contextvars.copy_context().run, work).result()


class PassingThread:
    """Calls run one after another on a thread of this object's, started when work comes and ended after
    `idle_s` without any: a run of batches shares one thread (and one OpenMP team), and none stays idle."""

    def __init__(self, name: str, idle_s: float = IDLE_S) -> None:
        self.name, self.idle_s = name, idle_s
        self._cond = threading.Condition()
        self._jobs: collections.deque[tuple[contextvars.Context, Callable[[], object], Future]] = collections.deque()
        self._thread: threading.Thread | None = None

    def run(self, work: Callable[[], T]) -> T:
        """`work()` on the thread, with the caller's context variables; its result or its exception here."""
        future: Future = Future()
        with self._cond:
            self._jobs.append((contextvars.copy_context(), work, future))
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
                self._thread.start()
            self._cond.notify()
        return future.result()

    def _serve(self) -> None:
        while True:
            with self._cond:
                if not self._jobs and not self._cond.wait_for(lambda: self._jobs, timeout=self.idle_s):
                    self._thread = None  # under the lock: a `run` from now on starts another thread
                    return
                context, work, future = self._jobs.popleft()
            try:
                future.set_result(context.run(work))
            except BaseException as exc:  # the caller's to raise
                future.set_exception(exc)
