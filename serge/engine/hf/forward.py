"""The transformers engine's forward passes over many sequences at once, each row getting the numbers it would
get alone, and its loader (`load_transformers`).

Continuous batching must not change what anyone is answered: greedy decoding of a prompt gives the
same text alone or beside fifteen others. A plain batch cannot promise that (the BLAS library picks
another kernel, and so another order of summation, for 1 row than for 8), so `BatchForward`:

- packs the decoding sequences' tokens into one row each, with no padding between them;
- on a CPU in float32, runs the linear layers on oneDNN's kernels over a weight packed for them
  (`rows.pack_for_onednn`, a second copy of those weights), and pads every batch with dummy rows
  to a row count measured at load to give every row the same bits (`rows.RowPlan`);
- attends per sequence over its own `kv.SequenceKV` with shapes that do not depend on its
  neighbours (`batch_attention`; in one call per layer through `cpu_attention`'s op on a CPU in
  float32; a Llama-style model there runs through `decoder.Decoder`, checked against
  transformers' logits at load);
- runs prompt chunks in the decodes' pass (`run`) only where the linear layers were measured at
  load to keep a row's bits in a pass that size (`rows.joins_rows`, `rows.joinable_rows`);
  elsewhere a chunk runs in a pass of its own;
- on a CUDA GPU, pages the KV instead (`paged.BlockPool`) and attends for the whole pass in one
  call per layer (`paged_attention`).

Why each choice, with the measurements behind it: bench/README.md ("The transformers engine's
batched forward"). This module knows nothing of streams, sampling or scheduling (`local.LocalModel`
and `generation.scheduler.Scheduler` do that), nor estimates memory before a load (`hf.family`).
"""

from __future__ import annotations

import itertools
import logging
import time

import torch  # extra: transformers

from serge.engine.hf import cpu_attention
from serge.engine.hf.batch_attention import install, per_sequence
from serge.engine.hf.decoder import Decoder
from serge.engine.generation.forward import OutOfKV
from serge.engine.hf.kv import SequenceKV
from serge.engine.hf.paged import BLOCK_SIZE, BlockPool, PagedKV
from serge.engine.generation.batching.passes import MOST_CHUNKS
from serge.engine.generation.batching.scheduler import Scheduler
from serge.engine.generation.sampling import SamplingParams
from serge.engine.local import LoadOptions, LocalModel, ModelLoadFailed, check_chat_template, eos_ids
from serge.engine.models.library import InstalledModel
from serge.engine.hf.paged_attention import PagedPass
from serge.engine.generation.batching.threads import ladder
from serge.engine.hf.rows import RowPlan, joinable_rows, joins_rows, measure_rows, pack_for_onednn, same_across_threads
from serge.engine.hf.vision import image_token_id, on_device

log = logging.getLogger(__name__)

class BatchForward:
    """The model's forward passes over sequences that each keep their own KV.

    With `pool_blocks`, the KV is paged (`PagedKV` in one `BlockPool` of that
    many blocks) and each layer attends for the whole pass in one call
    (`paged_attention`); without, each sequence keeps a growing `SequenceKV` and
    attention runs per sequence, which measured faster on a CPU (see `paged_attention`),
    and on a CPU a model `decoder.Decoder` knows runs through it rather than transformers' modules.
    `prepare()` runs on the thread that will run the passes (its thread count
    decides the kernels) before the first of them.
    """

    def __init__(self, model, max_rows: int, pool_blocks: int | None = None, join_chunk: int = 0) -> None:
        install(model)
        self._model = model
        config = model.config.get_text_config()
        self._layers = config.num_hidden_layers
        self.pool = None
        if pool_blocks:
            heads = config.num_attention_heads
            dim = getattr(config, "head_dim", None) or config.hidden_size // heads
            kv_heads = getattr(config, "num_key_value_heads", None) or heads
            self.pool = BlockPool(pool_blocks, self._layers, kv_heads, dim, model.dtype, model.device)
        self._max_rows = max_rows
        self._packed = pack_for_onednn(model)
        self._decoder = Decoder.build(model) if self._packed and self.pool is None else None
        self.rows: RowPlan | None = None
        self._counts: list[int] | None = None
        self._join_chunk = join_chunk  # the scheduler's prompt chunk: `joins` is a whole number of them
        self.joins = 0  # prompt tokens a pass may hold beside decodes and other chunks (`Forward.joins`)

    @property
    def device(self) -> torch.device:
        return self._model.device

    def close(self) -> None:
        """Nothing to free: the model's tensors (and the pool's) go with the registry's last reference."""

    def prepare(self) -> None:
        if self.rows is None:
            cpu_op = (self.pool is None and self.device.type == "cpu" and self._model.dtype == torch.float32
                      and cpu_attention.op() is not None)  # built here, at load, if this machine has none yet
            if self._decoder is not None:
                self._check_decoder()
            self.rows = measure_rows(self._model, self._max_rows, self._fused())
            if self._join_chunk:
                self.joins = self._measure_joins()
            log.info("passes are padded to %d, %d, %d, ... rows (%s linear layers); prompt chunks %s; forward: %s; "
                     "attention: %s", self.rows.least, self.rows.least + self.rows.step,
                     self.rows.least + 2 * self.rows.step, "oneDNN-packed" if self._packed else "plain",
                     f"join decodes, up to {self.joins} tokens a pass" if self.joins else "run in passes of their own",
                     "Serge's decoder" if self._decoder else "transformers'",
                     f"one call per layer over a paged KV cache of {self.pool.total_blocks} blocks of "
                     f"{self.pool.block_size}" if self.pool else
                     "per sequence, each over its own KV" + (", decodes in one call per layer (Serge's CPU op)"
                                                             if cpu_op else ""))

    def _measure_joins(self) -> int:
        """Up to `MOST_CHUNKS` chunks, as many as `rows.joinable_rows` can afford to check (fewer on a big
        model), if the check passes; 0 (passes apart) otherwise."""
        chunks = min(MOST_CHUNKS, (joinable_rows(self._model, self._fused()) - self._max_rows) // self._join_chunk)
        if chunks < 1:
            log.info("a pass of prompt chunks beside decodes would take too long to check at load on this model: "
                     "prompt chunks run in passes of their own")
            return 0
        tokens = chunks * self._join_chunk
        return tokens if self._joins_at([torch.get_num_threads()], tokens) else 0

    def _fused(self) -> list:
        return self._decoder.linears() if self._decoder is not None else []

    def _check_decoder(self) -> None:
        """Keep `Decoder` only if a prompt and a decode step through it give transformers' logits."""
        ids = list(range(1, 25))
        kvs = [self.new_kv(), self.new_kv()]
        decoder, self._decoder = self._decoder, None
        try:
            want = [self._pass([kvs[0]], [ids]), self._pass([kvs[0]], [[7]])]
            self._decoder = decoder
            got = [self._pass([kvs[1]], [ids]), self._pass([kvs[1]], [[7]])]
        finally:
            for kv in kvs:
                kv.release()
        if all(torch.equal(a, b) for a, b in zip(want, got)):
            decoder.release_unfused(self._model)
            return
        worst = max((a - b).abs().max().item() for a, b in zip(want, got))
        if worst <= 1e-4:
            decoder.release_unfused(self._model)
            log.info("Serge's decoder differs from transformers' forward by %.1e at most here", worst)
        else:
            self._decoder = None
            log.warning("Serge's decoder gave other logits than transformers' (%.1e): using transformers'", worst)

    def thread_counts(self, most: int) -> list[int]:
        """Measured once, on the linear layers (attention, norms and activations split their work by
        rows and heads, never within a sum)."""
        if self._counts is None:
            self._counts = same_across_threads(self._model, ladder(most), self.rows, self._fused())
            if self.joins and not self._joins_at(self._counts[1:], self.joins):
                log.info("a pass of prompt chunks beside decodes changes the linear layers' bits at other "
                         "thread counts here: prompt chunks run in passes of their own")
                self.joins = 0
        return self._counts

    def _joins_at(self, counts: list[int], tokens: int) -> bool:
        """Whether a pass of `tokens` prompt tokens beside every decode keeps each row's bits on each of `counts`."""
        before = torch.get_num_threads()
        try:
            for count in counts:
                torch.set_num_threads(count)
                if not joins_rows(self._model, self.rows, tokens + self._max_rows, self._fused()):
                    return False
        finally:
            torch.set_num_threads(before)
        return True

    def set_threads(self, n: int) -> None:
        torch.set_num_threads(n)  # OpenMP's pool of this thread, the worker's

    def new_kv(self) -> SequenceKV | PagedKV:
        return self.pool.new_kv() if self.pool is not None else SequenceKV(self._layers)

    def decode(self, kvs: list, tokens: list[int]) -> torch.Tensor:
        """Feed one token to each sequence; next-token logits, one row per sequence."""
        return self.run(kvs, [[token] for token in tokens])

    def prefill(self, kv, tokens: list[int], images: dict | None = None) -> torch.Tensor:
        """Feed a chunk of one sequence's prompt (with a vision model's pixel inputs for its image
        tokens); the logits after its last token."""
        return self.run([kv], [list(tokens)], images=images)[0]

    def run(self, kvs: list, chunks: list[list[int]], images: dict | None = None) -> torch.Tensor:
        """Feed `chunks[i]` to `kvs[i]`, decodes and prompt chunks in one pass; the next-token logits
        after each chunk's last token, one row per sequence.

        The pass's rows, and the rows its output head sees (one per chunk), are padded to the row
        plan, so each of them gets the bits it would get in a pass of its own (`joins` says up to
        how many rows that was measured for a pass holding prompt chunks)."""
        self.prepare()
        return self._pass(kvs, chunks, images)

    @torch.inference_mode()
    def _pass(self, kvs: list, chunks: list[list[int]], images: dict | None = None) -> torch.Tensor:
        rows = [len(chunk) for chunk in chunks]
        total = sum(rows)
        plan = self.rows or RowPlan(1, 1)  # none yet while `_check_decoder` runs, before the plan is measured
        padding = plan.rows_for(total) - total
        reserved = []
        try:
            for kv, n in zip(kvs, rows):
                kv.reserve(n)
                reserved.append(kv)
        except OutOfKV:
            for kv in reserved:
                kv.reserve(0)
                kv.shrink()  # a paged KV gives back the blocks it took for this pass
            raise
        ids = [token for chunk in chunks for token in chunk] + [0] * padding
        positions = [p for kv, n in zip(kvs, rows) for p in range(kv.length, kv.length + n)] + [0] * padding
        ends = [end - 1 for end in itertools.accumulate(rows)]  # plain ints: bookkeeping, not device work
        if self.pool is not None:
            extra = {"serge_pass": PagedPass(kvs, rows)}
        else:
            extra = {"serge_segments": [(kv, end + 1 - n, n) for kv, n, end in zip(kvs, rows, ends)]}
        try:
            keep = ends + ends[-1:] * (plan.rows_for(len(ends)) - len(ends))
            logits = self._logits(ids, positions, keep, images, extra)
        except BaseException:
            for kv in kvs:
                kv.reserve(0)  # what the failed pass wrote is not part of any sequence
            raise
        for kv in kvs:
            kv.advance()
        return logits[: len(kvs)]

    def _logits(self, ids: list[int], positions: list[int], keep: list[int], images, extra: dict):
        """One row of logits per position in `keep`: through `Decoder` where it runs the model."""
        device = self._model.device
        keep = torch.tensor(keep, device=device)
        if self._decoder is not None:
            segments = extra["serge_segments"]
            return self._decoder(
                torch.tensor(ids, device=device), torch.tensor(positions, device=device),
                lambda layer, q, k, v, window, scaling: per_sequence(layer, q, k, v, segments, scaling, window),
                keep)
        out = self._model(
            input_ids=torch.tensor([ids], device=device),
            position_ids=torch.tensor([positions], device=device),
            use_cache=False,
            logits_to_keep=keep,
            **(on_device(images, self._model) if images else {}),
            **extra,
        )
        return out.logits[0]


def pool_blocks(model, max_running: int, window: int) -> int | None:
    """Blocks of the paged KV pool, on a CUDA GPU only (the CPU's attention is faster per sequence;
    MPS keeps that path too): room for every running reply's window (at most 4096 positions each) or
    what half the GPU's free memory holds, whichever is less, and never less than one window."""
    if model.device.type != "cuda":
        return None
    config = model.config.get_text_config()
    heads = config.num_attention_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    per_token = 2 * config.num_hidden_layers * kv_heads * dim * model.dtype.itemsize
    free, _ = torch.cuda.mem_get_info(model.device)
    tokens = max(window, min(max_running * min(window, 4096), free // 2 // per_token))
    return -(-tokens // BLOCK_SIZE) + 1  # block 0 pads the tables


def load_transformers(installed: InstalledModel, options: LoadOptions) -> LocalModel:
    """Load a checkpoint folder with transformers (a GGUF is converted once to safetensors first); a
    vision model with its processor, as an image-text-to-text model."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

    plan = options.plan
    started = time.monotonic()
    source = installed.transformers_folder()
    vision = installed.facts.vision and installed.facts.format == "transformers"
    log.info("Loading %s with transformers on %s (%s) ...", installed.name, plan.device, plan.dtype_name)
    processor = AutoProcessor.from_pretrained(source) if vision else None
    tokenizer = processor.tokenizer if vision else AutoTokenizer.from_pretrained(source)
    if vision and getattr(processor, "chat_template", None):
        tokenizer.chat_template = processor.chat_template  # the processor's knows image parts
    check_chat_template(installed.name, tokenizer)
    if vision:
        _check_vision(installed.name, processor)
    model = (AutoModelForImageTextToText if vision else AutoModelForCausalLM).from_pretrained(
        source, **plan.load_kwargs())
    model.eval().requires_grad_(False)
    window = getattr(model.config.get_text_config(), "max_position_embeddings", None) or 2048
    if options.context_cap:
        window = min(window, options.context_cap)
    max_running = options.limits.running_for(model.device)
    blocks = pool_blocks(model, max_running, window)
    forward = BatchForward(model, max_running, blocks, join_chunk=options.limits.prefill_chunk)
    scheduler = Scheduler(forward, tokenizer, eos_ids(tokenizer, model.generation_config), options.threads,
                          installed.name, options.limits, options.metrics,
                          prefix_cache_bytes=forward.pool.block_bytes * blocks // 2 if blocks else None,
                          adapt_threads=options.adapt_threads)
    seconds = time.monotonic() - started
    log.info("Loaded %s in %.1f s", installed.name, seconds)
    return LocalModel(
        name=installed.name,
        engine="transformers",
        tokenizer=tokenizer,
        context_window=window,
        defaults=installed.defaults or SamplingParams(),
        source=installed.source,
        scheduler=scheduler,
        load_seconds=seconds,
        memory_bytes=model.get_memory_footprint(),
        model=model,
        processor=processor,
    )


def _check_vision(name: str, processor) -> None:
    """A processor Serge can splice into a prompt: one image token, and positions that are plain offsets
    (Qwen2-VL's 3-D rotary positions need more than the batcher's position ids give)."""
    try:
        image_token_id(processor)
    except ValueError as exc:
        raise ModelLoadFailed(name, f"model {name!r}: {exc}, so Serge cannot show it images") from None
    if type(processor).__name__.startswith(("Qwen2VL", "Qwen2_5_VL", "Qwen3VL")):
        raise ModelLoadFailed(name, f"model {name!r} places image tokens with 3-D rotary positions, which "
                                    f"Serge's batcher does not give yet; use a LLaVA-style, SmolVLM or Gemma 3 model")

