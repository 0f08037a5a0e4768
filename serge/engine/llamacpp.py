"""llama.cpp as a forward pass: GGUF weights in its own kernels, token ids in, logits out.

`LlamaForward` gives the `Scheduler` what `forward.BatchForward` gives it for
transformers, through llama-cpp-python's bindings to llama.cpp's C API: one
context per model whose KV cache is shared by every sequence (one sequence id
each), one `llama_decode` per step for every sequence being decoded, a prompt
chunk per call. So continuous batching, prefix reuse, sampling, stop strings and
metrics are Serge's own, the same as for transformers.

A finished conversation kept for prefix reuse leaves the cache for host memory
(`llama_state_seq_get_data`) and comes back when its next turn starts: llama.cpp
attends over every used cell of its one pool, masked or not, so cells kept for later
made every pass slower (8 streams: 48 -> 43 tok/s after two rounds here).

llama.cpp's KV cache has a fixed size: a pass that finds no room raises `OutOfKV`
and the scheduler gives back cached prefixes, then preempts. Every call happens on the
scheduler's worker thread. It knows nothing of prompts, streams or HTTP.
"""

from __future__ import annotations

import ctypes
import logging
import time

import numpy as np
import torch

from serge.engine.library import InstalledModel
from serge.engine.kvcache import OutOfKV
from serge.engine.local import LoadOptions, LocalModel, check_chat_template, eos_ids, load_tokenizer, sampling_defaults

log = logging.getLogger(__name__)

_MAX_SEQUENCES = 256  # llama.cpp's own limit on sequence ids in one context
_KV_BYTES = 2  # float16 keys and values, llama.cpp's default


class LlamaKV:
    """One sequence's cells in the shared KV cache, known by its sequence id; or, once the
    prefix cache keeps it, its keys and values parked in host memory and no cells at all."""

    def __init__(self, forward: LlamaForward, seq: int) -> None:
        self._forward = forward
        self.seq: int | None = seq
        self.length = 0
        self._parked: ctypes.Array | None = None

    def copy(self, length: int) -> LlamaKV:
        """A new sequence holding this one's first `length` cells."""
        other = self._forward.new_kv()
        if self._parked is not None:
            self._forward.restore(self._parked, other, length)
        else:
            self._forward.share(self, other, length)
        return other

    def shrink(self) -> None:
        """Out of llama.cpp's cache into host memory, for the prefix cache: every pass attends
        over every used cell (masked or not), so cells kept for later slow down all replies."""
        if self.seq is not None:
            self._parked = self._forward.park(self)
            self._forward.retire(self.seq)
            self.seq = None

    @property
    def nbytes(self) -> int:
        return len(self._parked) if self._parked is not None else self.length * self._forward.bytes_per_token

    def release(self) -> None:
        self._parked = None
        if self.seq is not None:
            self._forward.free(self)
            self.seq = None


class LlamaForward:
    """Forward passes of a llama.cpp model for sequences that each hold a `LlamaKV`."""

    device = torch.device("cpu")  # the logits come back to the host; sampling runs there

    def __init__(self, path: str, threads: int, cells: int, max_batch: int, batch_invariant: bool = False) -> None:
        import llama_cpp as lc

        self._lc = lc
        logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)  # its C logs go to stderr otherwise
        lc.llama_backend_init()
        params = lc.llama_model_default_params()
        params.n_gpu_layers = 0
        self._model = lc.llama_model_load_from_file(path.encode(), params)
        if not self._model:
            raise ValueError(f"llama.cpp could not load {path}")
        self.vocab = lc.llama_model_get_vocab(self._model)
        self.n_vocab = lc.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train = lc.llama_model_n_ctx_train(self._model)
        heads = lc.llama_model_n_head(self._model)
        head_dim = lc.llama_model_n_embd(self._model) // max(1, heads)
        kv_heads = lc.llama_model_n_head_kv(self._model)
        self.bytes_per_token = 2 * lc.llama_model_n_layer(self._model) * kv_heads * head_dim * _KV_BYTES
        self.cells = cells
        self.max_batch = max_batch
        self._threads = threads
        self._ctx = None
        self._batch = None
        self._free_ids = list(range(_MAX_SEQUENCES - 1, -1, -1))
        # Batch invariance: llama.cpp sums attention over cells in cache order, so a reply's
        # cells must stay in position order. Freeing a finished reply's cells while others
        # run leaves holes that their next tokens fill, below their earlier ones; so in this
        # mode those cells (`_retired`) are freed only once nothing runs, or room runs out.
        self._invariant = batch_invariant
        self._live = 0
        self._retired: list[int] = []

    @property
    def weights_bytes(self) -> int:
        return self._lc.llama_model_size(self._model)

    def eog_ids(self) -> set[int]:
        lc = self._lc
        return {t for t in (lc.llama_vocab_eos(self.vocab), lc.llama_vocab_eot(self.vocab)) if t >= 0}

    def prepare(self) -> None:
        """Create the context on the worker thread: llama.cpp's thread pool belongs to it."""
        if self._ctx is not None:
            return
        lc = self._lc
        params = lc.llama_context_default_params()
        params.n_ctx = self.cells
        params.n_batch = params.n_ubatch = self.max_batch
        params.n_seq_max = _MAX_SEQUENCES
        params.n_threads = params.n_threads_batch = self._threads
        params.kv_unified = True  # every sequence may use any cell: one pool for all of them
        params.no_perf = True
        self._ctx = lc.llama_init_from_model(self._model, params)
        if not self._ctx:
            raise RuntimeError(f"llama.cpp could not make a context of {self.cells} cells")
        self._mem = lc.llama_get_memory(self._ctx)
        self._batch = lc.llama_batch_init(self.max_batch, 0, 1)

    def close(self) -> None:
        lc = self._lc
        if self._batch is not None:
            lc.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx is not None:
            lc.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            lc.llama_model_free(self._model)
            self._model = None

    # --- sequences ---------------------------------------------------------------
    def new_kv(self) -> LlamaKV:
        self.prepare()
        if not self._live or not self._free_ids:
            self._free_retired()
        if not self._free_ids:
            raise OutOfKV("every llama.cpp sequence id is in use")
        self._live += 1
        return LlamaKV(self, self._free_ids.pop())

    def share(self, source: LlamaKV, target: LlamaKV, length: int) -> None:
        self._lc.llama_memory_seq_cp(self._mem, source.seq, target.seq, 0, length)
        target.length = length

    def park(self, kv: LlamaKV) -> ctypes.Array:
        lc = self._lc
        size = lc.llama_state_seq_get_size(self._ctx, kv.seq)
        buffer = (ctypes.c_uint8 * size)()
        if lc.llama_state_seq_get_data(self._ctx, buffer, size, kv.seq) != size:
            raise RuntimeError("llama.cpp could not copy a sequence out of its KV cache")
        return buffer

    def restore(self, parked: ctypes.Array, target: LlamaKV, length: int) -> None:
        """Parked cells back into the cache as `target`, cut to their first `length`."""
        def fits() -> bool:
            return self._lc.llama_state_seq_set_data(self._ctx, parked, len(parked), target.seq) != 0

        if not fits() and not (self._free_retired() and fits()):  # as `_run` does when out of room
            target.release()
            raise OutOfKV(f"llama.cpp's KV cache ({self.cells} cells) has no room for a cached conversation")
        self._lc.llama_memory_seq_rm(self._mem, target.seq, length, -1)
        target.length = length

    def free(self, kv: LlamaKV) -> None:
        self._live -= 1
        self._drop(kv.seq)

    def retire(self, seq: int) -> None:
        """A reply's cells are no longer needed (its keys and values are parked)."""
        self._live -= 1
        if self._invariant:
            self._retired.append(seq)
        else:
            self._drop(seq)

    def _free_retired(self) -> bool:
        for seq in self._retired:
            self._drop(seq)
        freed, self._retired = bool(self._retired), []
        return freed

    def _drop(self, seq: int) -> None:
        if self._ctx is not None:
            self._lc.llama_memory_seq_rm(self._mem, seq, -1, -1)
        self._free_ids.append(seq)

    # --- passes ------------------------------------------------------------------
    def decode(self, kvs: list[LlamaKV], tokens: list[int]) -> torch.Tensor:
        """Feed one token to each sequence; next-token logits, one row per sequence."""
        self._run([(kv, [token], True) for kv, token in zip(kvs, tokens)])
        return self._logits(len(kvs))

    def prefill(self, kv: LlamaKV, tokens: list[int]) -> torch.Tensor:
        """Feed a chunk of one sequence's prompt; the logits after its last token."""
        self._run([(kv, tokens, True)])
        return self._logits(1)[0]

    def _run(self, work: list[tuple[LlamaKV, list[int], bool]]) -> None:
        self.prepare()
        batch, n = self._batch, 0
        for kv, tokens, want_last in work:
            for i, token in enumerate(tokens):
                batch.token[n] = token
                batch.pos[n] = kv.length + i
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = kv.seq
                batch.logits[n] = want_last and i == len(tokens) - 1
                n += 1
        if n > self.max_batch:
            raise ValueError(f"a pass of {n} tokens is over llama.cpp's batch of {self.max_batch}")
        batch.n_tokens = n
        status = self._lc.llama_decode(self._ctx, batch)
        if status == 1 and self._free_retired():
            status = self._lc.llama_decode(self._ctx, batch)
        if status == 1:
            raise OutOfKV(f"llama.cpp's KV cache ({self.cells} cells) is full")
        if status != 0:
            for kv, _, _ in work:  # what a failed pass left behind is part of no sequence
                self._lc.llama_memory_seq_rm(self._mem, kv.seq, kv.length, -1)
            raise RuntimeError(f"llama_decode failed with status {status}")
        for kv, tokens, _ in work:
            kv.length += len(tokens)

    def _logits(self, rows: int) -> torch.Tensor:
        pointer = self._lc.llama_get_logits(self._ctx)
        return torch.from_numpy(np.ctypeslib.as_array(pointer, shape=(rows, self.n_vocab)).copy())


def kv_cells(options: LoadOptions, bytes_per_token: int, window: int, max_running: int) -> int:
    """KV cells for the whole model: the setting's megabytes, else room for a full-length
    conversation or `max_running` replies of 512 tokens, whichever is more."""
    if options.kv_cache_mb:
        return max(256, options.kv_cache_mb * 2**20 // bytes_per_token)
    return max(min(window, 4096), max_running * 512)


def footprint(weights_bytes: int, kv_bytes: int, options: LoadOptions) -> int:
    """Memory a loaded model takes: weights, its KV cache, and the conversations parked beside it."""
    return weights_bytes + kv_bytes + min(kv_bytes, options.limits.prefix_cache_mb * 2**20)


def load_llamacpp(installed: InstalledModel, options: LoadOptions) -> LocalModel:
    """Load a GGUF model on llama.cpp (CPU), with its Hugging Face tokenizer for prompts and text."""
    from serge.engine.scheduler import Scheduler

    if installed.gguf_path is None:
        raise ValueError(f"model {installed.name!r} has no GGUF file; llama.cpp cannot run it")
    started = time.monotonic()
    log.info("Loading %s with llama.cpp (%d threads) ...", installed.name, options.threads)
    tokenizer = load_tokenizer(installed)
    check_chat_template(installed.name, tokenizer)
    max_running = options.limits.running_for(LlamaForward.device)
    max_batch = max(options.limits.prefill_chunk, max_running)
    forward = LlamaForward(str(installed.gguf_path), options.threads, cells=0, max_batch=max_batch,
                           batch_invariant=options.batch_invariant)
    window = forward.n_ctx_train or 2048
    if options.context_cap:
        window = min(window, options.context_cap)
    forward.cells = kv_cells(options, forward.bytes_per_token, window, max_running)
    window = min(window, forward.cells)
    kv_bytes = forward.cells * forward.bytes_per_token
    eos = eos_ids(tokenizer) | forward.eog_ids()
    scheduler = Scheduler(forward, tokenizer, frozenset(eos), options.threads, installed.name, options.limits,
                          options.metrics, prefix_cache_bytes=kv_bytes)  # parked in host memory
    seconds = time.monotonic() - started
    log.info("Loaded %s in %.1f s (%d KV cells, %.0f MB)", installed.name, seconds, forward.cells, kv_bytes / 2**20)
    return LocalModel(
        name=installed.name,
        engine="llama.cpp",
        tokenizer=tokenizer,
        context_window=window,
        defaults=sampling_defaults(None, installed),
        scheduler=scheduler,
        load_seconds=seconds,
        memory_bytes=footprint(forward.weights_bytes, kv_bytes, options),
    )
