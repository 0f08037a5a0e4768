"""Ending the OpenMP team a thread started, once its torch work is done.

libgomp (torch's runtime) counts the helper threads of every OpenMP team in the process, and
a team lives as long as the thread that started it. Once that count passes the CPUs, every
team's barriers spin ~100 times instead of ~300,000 before they sleep: a chat on llama.cpp
built with OpenMP decoded 1.32-1.39x slower after three `/v1/embeddings` calls had left a
torch team on a thread of the server's pool, and a transformers model 1.19-1.24x slower while
a second one sat loaded and idle (figures: bench/README.md). llama.cpp is built without it
(`llamacpp/threadpool.py`), but the transformers engine's passes are torch's. So every thread
that runs torch ends its team when that work is done: a model's worker whenever it goes idle,
a load's caller after the load, an embedding's caller after each batch (as fast as batches
kept on one thread: 92-106 / 362-406 texts/s at batch 1 / 32, against 78-105 / 358-394).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

OMP_PAUSE_SOFT = 1  # omp.h's omp_pause_resource_t


@functools.cache
def _libgomp() -> ctypes.CDLL | None:
    """torch's OpenMP runtime on Linux; None elsewhere (macOS's libomp keeps no such count of threads) and where
    torch is not installed (llama.cpp's threads are its own pool, `llamacpp.threadpool`)."""
    from serge.engine.optional import torch_or_none

    torch = torch_or_none()
    if torch is None:
        return None

    path = Path(torch.__file__).parent / "lib" / "libgomp.so.1"
    return ctypes.CDLL(str(path)) if path.exists() else None


def end_team() -> None:
    """End the OpenMP team this thread started: its helpers exit, and the next parallel region starts
    another (tens of microseconds). OpenMP 5's omp_pause_resource_all, which libgomp carries out for the
    calling thread's team alone."""
    if (libgomp := _libgomp()) is not None:
        libgomp.omp_pause_resource_all(OMP_PAUSE_SOFT)
