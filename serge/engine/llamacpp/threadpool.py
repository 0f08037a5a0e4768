"""llama.cpp's own thread pool, for a build without OpenMP.

Built without OpenMP, ggml's threads wait at its barriers by spinning on atomics, whatever
else in the process runs OpenMP (torch does), and between passes they poll, then sleep on
a condition variable. But a context with no pool attached gets a new pool, threads and all,
for every pass; llama-server attaches one (`common_threadpools`), and so does `LlamaForward`,
through the C API llama-cpp-python loads but does not bind. (A GGUF embedding model and an
mmproj run a pass a batch or an image: they keep llama.cpp's pool of the pass.)
"""

from __future__ import annotations

import ctypes
from pathlib import Path

GGML_MAX_N_THREADS = 512  # ggml.h


class _Params(ctypes.Structure):
    _fields_ = [("cpumask", ctypes.c_bool * GGML_MAX_N_THREADS), ("n_threads", ctypes.c_int), ("prio", ctypes.c_int),
                ("poll", ctypes.c_uint32), ("strict_cpu", ctypes.c_bool), ("paused", ctypes.c_bool)]


def has_openmp(lc) -> bool:
    return b"OPENMP = 1" in lc.llama_print_system_info()


class ThreadPool:
    """A pool of `threads` threads attached to a llama.cpp context for its passes and its prompts'."""

    def __init__(self, lc, threads: int) -> None:
        lib = Path(lc.__file__).parent / "lib"
        base, self._cpu = ctypes.CDLL(str(lib / "libggml-base.so")), ctypes.CDLL(str(lib / "libggml-cpu.so"))
        base.ggml_threadpool_params_default.argtypes, base.ggml_threadpool_params_default.restype = [ctypes.c_int], _Params
        self._cpu.ggml_threadpool_new.argtypes, self._cpu.ggml_threadpool_new.restype = [ctypes.POINTER(_Params)], ctypes.c_void_p
        self._cpu.ggml_threadpool_free.argtypes, self._cpu.ggml_threadpool_free.restype = [ctypes.c_void_p], None
        self._llama = ctypes.CDLL(str(lib / "libllama.so"))
        self._llama.llama_attach_threadpool.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self._llama.llama_attach_threadpool.restype = None
        self._llama.llama_detach_threadpool.argtypes, self._llama.llama_detach_threadpool.restype = [ctypes.c_void_p], None
        params = base.ggml_threadpool_params_default(threads)
        self._pool = self._cpu.ggml_threadpool_new(ctypes.byref(params))
        if not self._pool:
            raise RuntimeError(f"llama.cpp could not start a pool of {threads} threads")
        self._ctx = None

    def attach(self, ctx) -> None:
        self._ctx = ctypes.cast(ctx, ctypes.c_void_p)
        self._llama.llama_attach_threadpool(self._ctx, self._pool, None)

    def close(self) -> None:
        """Detach it (the context must still exist) and end its threads."""
        if self._ctx is not None:
            self._llama.llama_detach_threadpool(self._ctx)
            self._ctx = None
        if self._pool:
            self._cpu.ggml_threadpool_free(self._pool)
            self._pool = None
