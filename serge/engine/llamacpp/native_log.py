"""llama.cpp's own log, through Python's logging: at debug level on the `llama.cpp` logger, errors as errors.

llama.cpp writes its loader's metadata dump, every tensor of a re-quantization and its
context's settings to stderr (~330 lines at a first start); llama-cpp-python's own callback
prints them until a `Llama` sets its logger's level. Here one callback (`llama_log_set`, and
mtmd's where the build has it) gathers each line (llama.cpp sends a line in pieces, the
later ones as "continued") and logs it: `serge serve --log-level debug` shows them all,
the default shows what Serge says about each stage. It decides nothing about what is logged
elsewhere.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading

log = logging.getLogger("llama.cpp")

_ERROR, _CONTINUED = 3, 5  # enum ggml_log_level: NONE, INFO, WARN, ERROR, DEBUG, CONT


class NativeLog:
    """Lines llama.cpp is writing, per thread (each thread's pieces make its own lines)."""

    def __init__(self) -> None:
        self._pending = threading.local()

    def write(self, level: int, text: bytes | None) -> None:
        pending = getattr(self._pending, "lines", None)
        if pending is None or level != _CONTINUED:  # a new message: what was held is a line of its own
            if pending:
                self._emit(pending)
            pending = self._pending.lines = [level if level != _CONTINUED else 0, ""]
        pending[1] += (text or b"").decode("utf-8", errors="replace")
        if pending[1].endswith("\n"):
            self._emit(pending)
            self._pending.lines = None

    @staticmethod
    def _emit(pending: list) -> None:
        level, line = pending
        line = line.rstrip()
        if line:
            log.log(logging.ERROR if level == _ERROR else logging.DEBUG, "%s", line)


@functools.cache
def route_native_log():
    """Send llama.cpp's (and mtmd's) log to the `llama.cpp` logger; once per process (the cache keeps the callback
    alive for as long as llama.cpp may call it)."""
    import llama_cpp

    lines = NativeLog()
    callback = llama_cpp.llama_log_callback(lambda level, text, _user: lines.write(level, text))
    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
    try:
        from llama_cpp import mtmd_cpp

        mtmd_cpp.mtmd_log_set(callback, ctypes.c_void_p(0))
        mtmd_cpp.mtmd_helper_log_set(callback, ctypes.c_void_p(0))
    except (ImportError, OSError, AttributeError):  # a build without mtmd
        pass
    return callback
