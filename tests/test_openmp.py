"""OpenMP's threads and the models' (`serge/engine/openmp.py`, `serge/engine/llamacpp/threadpool.py`).

libgomp counts the threads of every OpenMP team, each alive as long as the thread that started it;
past the CPUs every team's barriers sleep: a llama.cpp chat built with OpenMP decoded 1.32-1.39x slower
after three embedding requests had run torch on the server's thread pool (bench/README.md). So work off
a model's worker leaves no team behind, and llama.cpp is built without OpenMP, on a pool of its own.
On the real models; each caller is a long-lived thread, as the server's thread pool is. Threads are
counted in Linux's /proc.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import MODEL, bundled_gguf
from serge.engine import ChatRequest, Message, SamplingParams
from serge.engine.engine import Engine

pytestmark = [pytest.mark.real_model,
              pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in Linux's /proc")]

EMBEDDER = "all-minilm-l6-v2"


def native_threads() -> int:
    """Threads Python did not start: OpenMP's helpers among them."""
    return len(os.listdir("/proc/self/task")) - threading.active_count()


def native_threads_settle_at(count: int) -> int:
    """The count once it is `count`, or after 5 s: a thread Python has joined, and OpenMP's helpers told to end
    with it, leave the system a moment later."""
    settled = time.monotonic() + 5
    while (now := native_threads()) != count and time.monotonic() < settled:
        time.sleep(0.05)
    return now


class ThreadsSeen:
    """Every thread of this process seen while it runs, /proc read in a loop: a thread started and ended within a
    pass still shows. (Linux numbers threads system-wide, so ids cannot tell: other processes start threads too.)"""

    def __enter__(self) -> "ThreadsSeen":
        self.seen, self._done = set(os.listdir("/proc/self/task")), threading.Event()
        self._watcher = threading.Thread(target=self._watch)
        self._watcher.start()
        return self

    def _watch(self) -> None:
        while not self._done.is_set():
            self.seen |= set(os.listdir("/proc/self/task"))

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._watcher.join()
        self.seen.discard(str(self._watcher.native_id))


def test_an_embedding_leaves_no_team_on_its_caller(real_settings):
    engine = Engine(real_settings.model_copy(update={"torch_threads": 2}))  # a team of one helper per thread
    try:
        with ThreadPoolExecutor(1) as first:  # what a first load and batch start for good (tokenizer and torch pools)
            first.submit(engine.embed, EMBEDDER, ["warm up"]).result()
        assert engine.unload(EMBEDDER)
        with ThreadPoolExecutor(1) as caller:
            caller.submit(lambda: None).result()
            before = native_threads()
            caller.submit(engine.embed, EMBEDDER, ["a few words to embed, " * 20] * 40).result()  # loads; two batches
            assert native_threads_settle_at(before) == before
    finally:
        engine.close()


def test_a_load_leaves_no_team_on_its_caller(real_settings):
    """The transformers engine runs a forward pass at load (its check of joined rows), on the loading thread."""
    engine = Engine(real_settings.model_copy(update={"torch_threads": 2, "engine": "transformers"}))
    try:
        with ThreadPoolExecutor(1) as caller:
            caller.submit(lambda: None).result()
            before = native_threads()
            caller.submit(engine.model, MODEL).result()
            assert engine.unload(MODEL)  # its worker, and the worker's team, gone with it
            assert native_threads_settle_at(before) == before
    finally:
        engine.close()


def test_a_model_s_worker_ends_its_team_when_idle(real_settings):
    """A transformers model decoded 1.22x slower while a second one sat loaded and idle, its worker's team
    alive (bench/README.md)."""
    engine = Engine(real_settings.model_copy(update={"torch_threads": 2, "engine": "transformers"}))
    request = ChatRequest([Message("user", "Name a colour.")], SamplingParams(temperature=0, max_new_tokens=4))
    try:
        list(engine.chat(MODEL, request))  # what a first load and reply start for good (tokenizer and torch pools)
        assert engine.unload(MODEL)
        before = native_threads_settle_at(native_threads())
        list(engine.chat(MODEL, request))  # loads, then the worker runs the reply with a team of two
        assert engine.info(MODEL).loaded  # its worker still there, idle
        assert native_threads_settle_at(before) == before  # idle now: no helper left
    finally:
        engine.close()


def test_llama_cpp_runs_its_passes_on_a_pool_of_its_own_not_on_openmp(tmp_path_factory):
    """Built without OpenMP (scripts/llama_build.py), ggml's barriers spin on atomics whatever torch's teams do; a
    context without a pool attached would start its threads anew for every pass."""
    import llama_cpp

    from serge.engine.llamacpp.forward import LlamaForward
    from serge.engine.llamacpp.threadpool import has_openmp

    assert not has_openmp(llama_cpp), "llama-cpp-python was built with OpenMP: `rm .venv/.llama && make install`"
    forward = LlamaForward(str(bundled_gguf(tmp_path_factory)), threads=2, max_batch=64)
    forward.size(1, 256)
    before = set(os.listdir("/proc/self/task"))
    forward.prepare()
    try:
        helpers = set(os.listdir("/proc/self/task")) - before
        assert len(helpers) == 1  # the pool's second thread; the caller is its first
        running = set(os.listdir("/proc/self/task"))
        with ThreadsSeen() as threads:
            kv = forward.new_kv()
            forward.prefill(kv, list(range(100, 164)))
            for _ in range(16):
                forward.decode([kv], [5])
        assert threads.seen == running  # no thread started for the passes
        assert helpers <= set(os.listdir("/proc/self/task"))
    finally:
        forward.close()
    assert not helpers & set(os.listdir("/proc/self/task"))  # ended with the context
