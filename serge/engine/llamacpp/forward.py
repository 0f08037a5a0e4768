"""llama.cpp as a forward pass: GGUF weights in its own kernels, token ids in, logits out.

`LlamaForward` gives the `Scheduler` what `hf.forward.BatchForward` gives it for
transformers, through llama-cpp-python's bindings to llama.cpp's C API: one
context per model, one `llama_decode` per step for every sequence being decoded,
a prompt chunk per call. So continuous batching, prefix reuse, sampling, stop
strings and metrics are Serge's own, the same as for transformers.

The KV cache is cut into slices, one per running reply (llama.cpp's
per-sequence streams, as `llama-server --parallel` has), each the reply's whole
context window, in the type `SERGE_LLAMA_KV_TYPE` names (`memory` plans both).
One pool shared by every reply would hold more replies in the same memory, but
llama.cpp attends over every used cell of a pool, masked or not, so many streams
decode slower from one pool (figures: bench/README.md). In its own slice a reply's cells also
stay in position order whatever the others do, so a greedy reply is the same text
alone or batched (in f16 on several threads up to 256 cells: past them llama.cpp's flash
attention sums the cells of a reply decoding alone in parts, one per thread, and a batched
one's on one thread; the 8-bit types never do). A finished conversation kept for prefix reuse leaves its slice for
host memory (`llama_state_seq_get_data`) and is copied into a free slice when its
next turn starts.

Layers go to the GPU where this llama.cpp build has one (CUDA, Metal), as many as fit
(`offload.plan_offload`); each layer's slice of the KV cache lives with its layer,
and the logits always come back to the host, where sampling runs.

A model with an mmproj GGUF beside it sees images where this build has mtmd (`vision`).

Every call happens on the scheduler's worker thread. It knows nothing of prompts,
streams or HTTP.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import time

import numpy as np

from serge.engine.models.library import InstalledModel
from serge.engine.generation.batching.host_sampling import HOST
from serge.engine.generation.kv.kv_store import KvStore
from serge.engine.generation.batching.passes import kept
from serge.engine.generation.sampling import SamplingParams
from serge.engine.generation.batching.scheduler import Scheduler
from serge.engine.generation.batching.threads import ladder
from serge.engine.llamacpp.batch import LlamaBatch
from serge.engine.llamacpp.kv import LlamaKV, host_pages
from serge.engine.llamacpp.memory import KvType, choose_kv, footprint, kv_layout, kv_type, placement
from serge.engine.llamacpp.offload import plan_offload
from serge.engine.llamacpp.vision import LlamaVision, load_vision
from serge.engine.llamacpp.options import LlamaOptions
from serge.engine.llamacpp.threadpool import ThreadPool, has_openmp
from serge.engine.local import LocalModel, check_chat_template, eos_ids, load_tokenizer

log = logging.getLogger(__name__)

JOIN_CHUNKS = 2  # prompt chunks a pass may hold beside the decodes: 512 tokens by default, llama-server's ubatch
# Layouts whose prompt chunks join the decodes' pass: Q8_0 was measured as fast or faster joined, Q4_1 slower
# (figures: bench/README.md), so Q4_1 and the rest run their chunks apart.
JOINS_FASTER = frozenset({"Q8_0"})


class LlamaForward:
    """Forward passes of a llama.cpp model for sequences that each hold a `LlamaKV`."""

    device = HOST  # the logits come back to the host; sampling runs there, in numpy (no torch)

    def __init__(self, path: str, threads: int, max_batch: int, gpu_layers: int = 0,
                 kv: KvType = kv_type("f16"), joins: int = 0) -> None:
        import llama_cpp as lc

        from serge.engine.llamacpp.native_log import route_native_log

        route_native_log()
        self._lc = lc
        self.version = lc.__version__
        logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)  # its C logs go to stderr otherwise
        lc.llama_backend_init()
        params = lc.llama_model_default_params()
        params.n_gpu_layers = gpu_layers  # of n_layer + 1 (the output layer); each layer's KV cache goes with it
        # llama.cpp's AMX kernels (Intel Sapphire Rapids and later) crashed in their first matrix product
        # on Q4_1 weights here (a segfault in ggml_backend_amx_mul_mat): keep its other repacked layouts
        # only where the CPU has no AMX.
        params.use_extra_bufts = b"AMX_INT8 = 1" not in lc.llama_print_system_info()
        self._model = lc.llama_model_load_from_file(path.encode(), params)
        if not self._model:
            raise ValueError(f"llama.cpp could not load {path}")
        self.vocab = lc.llama_model_get_vocab(self._model)
        self.n_vocab = lc.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train = lc.llama_model_n_ctx_train(self._model)
        self.n_layer = lc.llama_model_n_layer(self._model)
        heads = lc.llama_model_n_head(self._model)
        head_dim = lc.llama_model_n_embd(self._model) // max(1, heads)
        kv_heads = lc.llama_model_n_head_kv(self._model)
        self.kv = kv  # may change until `prepare` makes the context
        self.f16_bytes_per_token = 2 * self.n_layer * kv_heads * head_dim * 2
        self.slices = 1  # `size` sets these before `prepare`
        self.cells = 0  # per slice
        self.max_batch = max_batch
        # Prompt tokens a pass may hold beside every decode (`Forward.joins`): a prompt arriving while others
        # decode then costs them no pass of its own (llama-server's mixed batches do the same).
        self.joins = joins
        self._threads = threads
        self._ctx = None
        self._pool: ThreadPool | None = None  # a build without OpenMP: llama.cpp's own, attached to the context
        self._batch = None
        self._logits_at, self._logits_views = 0, {}  # llama.cpp's output buffer, and views of its first rows
        self._free_ids: list[int] = []
        self.vision: LlamaVision | None = None  # a model with an mmproj: its images' chunks go through it

    @property
    def bytes_per_token(self) -> int:
        return self.kv.bytes_per_token(self.f16_bytes_per_token)

    @property
    def weights_bytes(self) -> int:
        return self._lc.llama_model_size(self._model)

    def eog_ids(self) -> set[int]:
        lc = self._lc
        return {t for t in (lc.llama_vocab_eos(self.vocab), lc.llama_vocab_eot(self.vocab)) if t >= 0}

    def size(self, slices: int, cells: int) -> None:
        """The KV cache's layout (see `kv_layout`), before the context exists."""
        self.slices, self.cells = slices, cells
        self.max_batch = max(self.max_batch, slices + self.joins)  # a decode pass holds one token per slice

    @property
    def kv_bytes(self) -> int:
        return self.slices * self.cells * self.bytes_per_token

    def prepare(self) -> None:
        """Create the context on the worker thread: llama.cpp's thread pool belongs to it."""
        if self._ctx is not None:
            return
        lc = self._lc
        params = lc.llama_context_default_params()
        params.n_ctx = self.slices * self.cells
        params.n_batch = params.n_ubatch = self.max_batch
        params.n_seq_max = self.slices
        params.n_threads = params.n_threads_batch = self._threads
        params.kv_unified = False  # a slice of the cache per sequence id
        params.no_perf = True
        params.offload_kqv = True  # a layer's keys and values where the layer is (llama.cpp's default, said here)
        params.type_k, params.type_v = self.kv.type_k, self.kv.type_v
        params.flash_attn_type = int(self.kv.flash_attention)  # enabled or disabled, never llama.cpp's auto
        self._ctx = lc.llama_init_from_model(self._model, params)
        if not self._ctx:
            raise RuntimeError(f"llama.cpp could not make a context of {self.slices} x {self.cells} cells")
        if not has_openmp(lc):
            self._pool = ThreadPool(lc, self._threads)
            self._pool.attach(self._ctx)
        self._mem = lc.llama_get_memory(self._ctx)
        self._batch = LlamaBatch(lc, self.max_batch)
        self._free_ids = list(range(self.slices - 1, -1, -1))  # lowest first: a pass's slices stay together

    def thread_counts(self, most: int) -> list[int]:
        """Every halving: ggml computes each dot product on one thread, whatever their number
        (`tests/test_batching.py` checks the logits at 1 and 2 threads), except f16 flash attention over
        more than 256 cells of a reply decoding alone, which it sums in parts, one per thread."""
        return ladder(most)

    def set_threads(self, n: int) -> None:
        self._lc.llama_set_n_threads(self._ctx, n, n)

    def close(self) -> None:
        lc = self._lc
        if self.vision is not None:
            self.vision.close()
        self._batch = None  # numpy's arrays: nothing of llama.cpp's to free
        if self._ctx is not None:
            if self._pool is not None:
                self._pool.close()
                self._pool = None
            lc.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            lc.llama_model_free(self._model)
            self._model = None

    # --- sequences ---------------------------------------------------------------
    def new_kv(self) -> LlamaKV:
        self.prepare()
        if not self._free_ids:
            raise RuntimeError(f"all {self.slices} slices of llama.cpp's KV cache are in use")
        return LlamaKV(self, self._free_ids.pop())

    def park(self, kv: LlamaKV) -> ctypes.Array:
        lc = self._lc
        size = lc.llama_state_seq_get_size(self._ctx, kv.seq)
        buffer = host_pages(size)
        if lc.llama_state_seq_get_data(self._ctx, buffer, size, kv.seq) != size:
            raise RuntimeError("llama.cpp could not copy a sequence out of its KV cache")
        return buffer

    def parked_data(self, kv: LlamaKV) -> memoryview:
        """A parked sequence's bytes, as llama.cpp wrote them (for `kv_store`)."""
        if kv._parked is None:
            raise ValueError("only a parked sequence (one the prefix cache keeps) is handed over as bytes")
        return memoryview(kv._parked)

    def parked_kv(self, data: memoryview, length: int) -> LlamaKV:
        """A sequence of `length` cells parked from `data` (`parked_data`'s, from an earlier run): no slice until used."""
        kv = LlamaKV(self, None)
        kv.length = length
        kv._parked = host_pages(len(data))
        np.frombuffer(kv._parked, np.uint8)[:] = np.frombuffer(data, np.uint8)
        return kv

    def restore(self, parked: ctypes.Array, target: LlamaKV, length: int) -> None:
        """Parked cells back into the cache as `target`, cut to their first `length`."""
        if self._lc.llama_state_seq_set_data(self._ctx, parked, len(parked), target.seq) == 0:
            target.release()
            raise RuntimeError("llama.cpp could not copy a cached conversation back into its KV cache")
        self._lc.llama_memory_seq_rm(self._mem, target.seq, length, -1)
        target.length = length

    def free(self, kv: LlamaKV) -> None:
        if self._ctx is not None:
            self._lc.llama_memory_seq_rm(self._mem, kv.seq, -1, -1)
        self._free_ids.append(kv.seq)
        self._free_ids.sort(reverse=True)  # the lowest taken first again: replies admitted together decode in order

    # --- passes ------------------------------------------------------------------
    def decode(self, kvs: list[LlamaKV], tokens: list[int]) -> np.ndarray:
        """Feed one token to each sequence; next-token logits, one row per sequence: a numpy view of llama.cpp's
        own buffer, good until the next pass (the scheduler samples them before it runs another).

        The pass lists them in slice order: out of order, llama.cpp decoded many streams slower
        (figures: bench/README.md)."""
        return self.run(kvs, [[token] for token in tokens])

    def run(self, kvs: list[LlamaKV], chunks: list[list[int]]) -> np.ndarray:
        """Decodes (one-token chunks) and prompt chunks in one pass, in slice order; the logits after each
        chunk's last token, in the callers' order (a copy where the order differs, else a view)."""
        order = sorted(range(len(kvs)), key=lambda i: kvs[i].seq)
        self._run([(kvs[i], chunks[i], True) for i in order])
        logits = self._logits(len(kvs))
        if order == list(range(len(kvs))):
            return logits
        return logits[np.argsort(order)]

    def prefill(self, kv: LlamaKV, tokens: list[int], images: dict | None = None) -> np.ndarray:
        """Feed a chunk of one sequence's prompt (with images: all of it, through `vision`); the logits after
        its last token (a copy: they are kept)."""
        if images is not None:
            return self.vision.prefill(self, kv, tokens, images)
        self._run([(kv, tokens, True)])
        return kept(self._logits(1)[0])

    def _run(self, work: list[tuple[LlamaKV, list[int], bool]]) -> None:
        self.prepare()
        n = sum(len(tokens) for _, tokens, _ in work)
        if n > self.max_batch:
            raise ValueError(f"a pass of {n} tokens is over llama.cpp's batch of {self.max_batch}")
        self._batch.fill(work)
        status = self._lc.llama_decode(self._ctx, self._batch.struct)
        if status == 1:
            raise RuntimeError(f"a slice of llama.cpp's KV cache ({self.cells} cells) is full")
        if status != 0:
            for kv, _, _ in work:  # what a failed pass left behind is part of no sequence
                self._lc.llama_memory_seq_rm(self._mem, kv.seq, kv.length, -1)
            raise RuntimeError(f"llama_decode failed with status {status}")
        for kv, tokens, _ in work:
            kv.length += len(tokens)
            kv._snapshot = None  # out of date: given back to the system now, not at the next copy

    def _logits(self, rows: int) -> np.ndarray:
        """The last pass's output rows, as a numpy view of llama.cpp's buffer (no copy). The views are kept while
        the buffer stays where it is: making one cost about 1% of a one-reply decode step, and so did torch's
        first touch of a tensor after a pass, which a greedy reply's argmax in numpy never makes (figures:
        bench/README.md)."""
        address = ctypes.addressof(self._lc.llama_get_logits(self._ctx).contents)
        if address != self._logits_at:
            self._logits_at, self._logits_views = address, {}
        view = self._logits_views.get(rows)
        if view is None:
            array = (ctypes.c_float * (rows * self.n_vocab)).from_address(address)
            view = self._logits_views[rows] = np.frombuffer(array, np.float32).reshape(rows, self.n_vocab)
        return view


def _kv_store(installed: InstalledModel, forward: LlamaForward, options: LlamaOptions) -> KvStore | None:
    """Where this model's prefix cache is kept across restarts: bytes that only this file, KV layout and
    llama.cpp build can read back."""
    if options.kv_store is None or installed.gguf_path is None:
        return None
    file = installed.gguf_path.stat()
    identity = {"model": installed.name, "file": str(installed.gguf_path.resolve()), "size": file.st_size,
                "mtime_ns": file.st_mtime_ns, "llama.cpp": forward.version, "kv": forward.kv.name,
                "cells": forward.cells, "vocabulary": forward.n_vocab}
    return KvStore(options.kv_store, identity, forward.parked_data, forward.parked_kv)


def load_llamacpp(installed: InstalledModel, options: LlamaOptions) -> LocalModel:
    """Load a GGUF model on llama.cpp, on the GPU as far as it fits, with its Hugging Face tokenizer."""
    if installed.gguf_path is None:
        raise ValueError(f"model {installed.name!r} has no GGUF file; llama.cpp cannot run it")
    started = time.monotonic()
    planned = placement(installed.facts, options).offload  # decided from the facts: n_gpu_layers is a load param
    log.info("Loading %s with llama.cpp (%d threads; %s, as %s) ...", installed.name, options.threads,
             planned.describe(), planned.why)
    tokenizer = load_tokenizer(installed)
    check_chat_template(installed.name, tokenizer)
    forward = LlamaForward(str(installed.gguf_path), options.threads, max_batch=options.limits.prefill_chunk,
                           gpu_layers=planned.n_gpu_layers,
                           joins=JOIN_CHUNKS * options.limits.prefill_chunk
                           if installed.facts.quantization in JOINS_FASTER else 0)
    forward.kv, kv_why = choose_kv(options)
    forward.size(*kv_layout(options, forward.bytes_per_token, forward.n_ctx_train or 2048, forward.weights_bytes))
    forward.vision = load_vision(installed, forward._model, options.threads, planned.n_gpu_layers > 0, tokenizer)
    kv_bytes = forward.kv_bytes
    offload = planned  # the same split, counted again on the model's own numbers and its KV cache as made
    if planned.n_gpu_layers:
        offload = dataclasses.replace(plan_offload(forward.n_layer, forward.weights_bytes // (forward.n_layer + 1),
                                                   kv_bytes, 0, None, planned.n_gpu_layers, planned.device),
                                      why=planned.why)
    memory = footprint(forward.weights_bytes + (forward.vision.nbytes if forward.vision else 0), kv_bytes, options,
                       offload)
    eos = eos_ids(tokenizer) | forward.eog_ids()
    limits = dataclasses.replace(options.limits, max_running=forward.slices)
    scheduler = Scheduler(forward, tokenizer, frozenset(eos), options.threads, installed.name, limits,
                          options.metrics, prefix_cache_bytes=kv_bytes,  # parked in host memory
                          adapt_threads=options.adapt_threads, kv_store=_kv_store(installed, forward, options))
    seconds = time.monotonic() - started
    log.info("Loaded %s in %.1f s on %s (%d replies at once, %d tokens each; KV cache %d x %d cells of %s%s, %.0f MB: "
             "%s; prompt chunks %s; %.0f MB on the GPU, %.0f MB in host memory)", installed.name, seconds,
             offload.describe(), forward.slices, forward.cells, forward.slices, forward.cells, forward.kv.name,
             " with flash attention" if forward.kv.flash_attention else "", kv_bytes / 2**20, kv_why,
             f"join the decodes' pass ({installed.facts.quantization}: measured faster so)" if forward.joins
             else f"run in passes of their own ({installed.facts.quantization} was measured slower joined)",
             memory.gpu_bytes / 2**20, memory.host_bytes / 2**20)
    return LocalModel(
        name=installed.name,
        engine="llama.cpp",
        tokenizer=tokenizer,
        context_window=forward.cells,
        defaults=installed.defaults or SamplingParams(),
        source=installed.source,
        scheduler=scheduler,
        load_seconds=seconds,
        memory_bytes=memory.total,
        device=offload.describe(),
        gpu_bytes=memory.gpu_bytes,
        kv_cache=f"{forward.slices} x {forward.cells} cells, {forward.kv.name}",
        vision=forward.vision,
    )
