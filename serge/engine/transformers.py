"""The transformers engine: its loader, its memory estimate, and its forward passes over many sequences
at once, each getting the numbers it would get alone.

Continuous batching must not change what anyone is answered: greedy decoding of
a prompt gives the same text whether it runs alone or beside fifteen others. A
plain batch cannot promise that: the BLAS library picks another kernel, and so
another order of summation, for a matrix of 1 row than for 8, so a row's result
depends on how many rows were beside it, and a near-tie between two tokens can
flip. Here, therefore:

- the sequences being decoded share one forward pass, with their tokens packed
  into one row each (no padding between them);
- on a CPU in float32 the model's linear layers are swapped, once at load, for
  ones that run oneDNN's kernels on the weight packed for them (a second copy of
  those weights in memory): measured invariant for any row count from 2, and a
  decode step took 44 ms alone, 56 ms for 8 sequences and 85 ms for 16 on 2
  cores, where MKL's kernels (which torch's linear uses) needed multiples of 4
  rows and took 83, 90 and 122 ms, and fixed tiles of 2 rows took 96, 239 and 419;
- at load, the linear layers are measured: which row counts give every row the
  same bits as any other of those counts, on this machine's kernels and thread
  count (`RowPlan`); every decode batch is padded with dummy rows to such a count;
- attention runs per sequence, over that sequence's own `SequenceKV`, with the
  same shapes whether it is alone or not (an attention function registered with
  transformers; the model's other code is used as is);
- a prompt chunk runs in a forward pass of its own, whose shape depends only on
  that sequence's prompt.

This module knows nothing of streams, sampling or scheduling: `LocalModel` and the `Scheduler` do that.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from serge.engine.devices import DevicePlan
from serge.engine.generation.kvcache import SequenceKV
from serge.engine.generation.scheduler import Scheduler
from serge.engine.generation.sampling import SamplingParams
from serge.engine.local import LoadOptions, LocalModel, check_chat_template, eos_ids
from serge.engine.models.facts import ModelFacts
from serge.engine.models.library import InstalledModel

log = logging.getLogger(__name__)

ATTENTION = "serge_per_sequence"
# (least rows, step): candidates for the row counts a batch is padded to, cheapest first
_ROW_CANDIDATES = ((1, 1), (2, 1), (4, 1), (4, 4), (8, 8), (16, 16), (32, 32))


@dataclass(frozen=True)
class RowPlan:
    """Batches are padded to `least`, `least + step`, `least + 2 * step`, ... rows."""

    least: int
    step: int

    def rows_for(self, n: int) -> int:
        if n <= self.least:
            return self.least
        return self.least + -(-(n - self.least) // self.step) * self.step


class _PackedLinear(torch.nn.Module):
    """A linear layer whose weight is also packed once for oneDNN's kernels, which run it."""

    def __init__(self, linear: torch.nn.Linear, packed: torch.Tensor) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # the same parameter: tied embeddings and the state dict are unchanged
        self.bias = linear.bias
        self.register_buffer("packed", packed, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
        return out.reshape(*x.shape[:-1], self.out_features)


def _pack_for_onednn(model) -> bool:
    """Swap the model's linear layers for oneDNN-packed ones (CPU, float32); False where unavailable.

    The model is the engine's and runs only through `BatchForward`, which is why
    its layers may be swapped; the weights themselves are neither moved nor changed.
    """
    if model.device.type != "cpu" or model.dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        return False
    swaps, packed = [], {}
    try:
        for parent in model.modules():
            for name, child in parent.named_children():
                if type(child) is torch.nn.Linear:
                    key = id(child.weight)
                    if key not in packed:
                        packed[key] = torch.ops.mkldnn._reorder_linear_weight(child.weight.detach(), None)
                    swaps.append((parent, name, _PackedLinear(child, packed[key])))
    except (RuntimeError, AttributeError) as exc:  # a torch build without these ops
        log.info("oneDNN weight packing unavailable (%s); using plain linear layers", exc)
        return False
    for parent, name, layer in swaps:
        setattr(parent, name, layer)
    return True


def _linear_shapes(model) -> list[torch.nn.Module]:
    """One linear layer of each distinct shape (and bias-ness) in the model."""
    seen: dict[tuple, torch.nn.Module] = {}
    for module in model.modules():
        if isinstance(module, (torch.nn.Linear, _PackedLinear)):
            seen.setdefault((tuple(module.weight.shape), module.bias is not None), module)
    return list(seen.values())


@torch.inference_mode()
def measure_rows(model, max_rows: int) -> RowPlan:
    """The cheapest `RowPlan` under which every row of every linear layer gets the same bits
    whatever the batch's size, found by running the model's own layers."""
    modules = _linear_shapes(model)
    top = max(max_rows, 2)
    generator = torch.Generator(device="cpu").manual_seed(0)
    try:
        for least, step in _ROW_CANDIDATES:
            plan = RowPlan(least, step)
            counts = sorted({plan.rows_for(n) for n in range(1, top + 1)})
            if all(_same_rows(m, counts, generator, model.dtype, model.device) for m in modules):
                return plan
    except Exception:  # a layer that cannot be run alone (exotic quantization): take the safe plan
        log.exception("could not measure the linear layers")
    return RowPlan(top, top)  # one fixed shape: always the same kernel


def _same_rows(module: torch.nn.Module, counts: list[int], generator: torch.Generator, dtype, device) -> bool:
    # The model's compute dtype, not the weight's: quantized weights are stored as integers.
    x = torch.randn(counts[-1], module.in_features, generator=generator).to(device=device, dtype=dtype)
    largest = module(x)
    return all(torch.equal(module(x[:n]), largest[:n]) for n in counts[:-1])


def _per_sequence_attention(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None, **kwargs
):
    """Attention for a packed batch: each sequence over its own keys and values.

    Called by the model's attention layers with `serge_segments`, a list of
    (SequenceKV, first row, rows). Without it (someone else running the model)
    it is plain SDPA.
    """
    segments = kwargs.pop("serge_segments", None)
    if segments is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
            sliding_window=sliding_window, **kwargs,
        )
    if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
        raise NotImplementedError("this model's attention (soft-capping or sinks) is not supported by the batcher")
    heads, rows, dim = query.shape[1], query.shape[2], query.shape[3]
    kv_heads = key.shape[1]
    group = heads // kv_heads
    out = query.new_zeros(1, rows, heads, dim)
    for kv, start, n in segments:
        keys, values = kv.write(module.layer_idx, key[0, :, start : start + n], value[0, :, start : start + n])
        length = keys.shape[1]
        # The query heads sharing a key head become rows of one query: no copy of the keys per head.
        q = query[0, :, start : start + n].reshape(kv_heads, group * n, dim).contiguous()
        mask = None
        if n > 1 or (sliding_window and length > sliding_window):
            position = torch.arange(length - n, length, device=q.device)[:, None]
            key_position = torch.arange(length, device=q.device)[None, :]
            mask = key_position <= position
            if sliding_window:
                mask &= key_position > position - sliding_window
            mask = mask.repeat(group, 1)
        o = F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=mask, scale=scaling)
        out[0, start : start + n] = o[0].reshape(heads, n, dim).transpose(0, 1)
    return out, None


def _install(model) -> None:
    """Route the model's attention through `_per_sequence_attention` (plain SDPA for other callers)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(ATTENTION, _per_sequence_attention)
    AttentionMaskInterface.register(ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    if model.config._attn_implementation != ATTENTION:
        model.set_attn_implementation(ATTENTION)
    if model.config._attn_implementation != ATTENTION:
        raise ValueError(f"{type(model).__name__} does not let its attention be replaced; it cannot be batched")


class BatchForward:
    """The model's forward passes, for sequences that each keep their own `SequenceKV`.

    `prepare()` runs on the thread that will run the passes (its thread count
    decides the kernels) before the first of them.
    """

    def __init__(self, model, max_rows: int) -> None:
        _install(model)
        self._model = model
        self._layers = model.config.get_text_config().num_hidden_layers
        self._max_rows = max_rows
        self._packed = _pack_for_onednn(model)
        self.rows: RowPlan | None = None

    @property
    def device(self) -> torch.device:
        return self._model.device

    def close(self) -> None:
        """Nothing to free: the model's tensors go with the registry's last reference."""

    def prepare(self) -> None:
        if self.rows is None:
            self.rows = measure_rows(self._model, self._max_rows)
            log.info("decode batches are padded to %d, %d, %d, ... rows (%s linear layers)", self.rows.least,
                     self.rows.least + self.rows.step, self.rows.least + 2 * self.rows.step,
                     "oneDNN-packed" if self._packed else "plain")

    def new_kv(self) -> SequenceKV:
        return SequenceKV(self._layers)

    @torch.inference_mode()
    def decode(self, kvs: list[SequenceKV], tokens: list[int]) -> torch.Tensor:
        """Feed one token to each sequence; next-token logits, one row per sequence."""
        device = self._model.device
        self.prepare()
        pad = self.rows.rows_for(len(kvs)) - len(kvs)
        positions = torch.tensor([[kv.length for kv in kvs] + [0] * pad], device=device)
        for kv in kvs:
            kv.reserve(1)
        segments = [(kv, i, 1) for i, kv in enumerate(kvs)]
        try:
            out = self._model(
                input_ids=torch.tensor([list(tokens) + [0] * pad], device=device),
                position_ids=positions,
                use_cache=False,
                logits_to_keep=0,
                serge_segments=segments,
            )
        except BaseException:
            for kv in kvs:
                kv.reserve(0)  # what the failed pass wrote is not part of any sequence
            raise
        for kv in kvs:
            kv.advance()
        return out.logits[0, : len(kvs)]

    @torch.inference_mode()
    def prefill(self, kv: SequenceKV, tokens: list[int]) -> torch.Tensor:
        """Feed a chunk of one sequence's prompt; the logits after its last token."""
        device = self._model.device
        n = len(tokens)
        positions = torch.arange(kv.length, kv.length + n, device=device)[None]
        kv.reserve(n)
        try:
            out = self._model(
                input_ids=torch.tensor([tokens], device=device),
                position_ids=positions,
                use_cache=False,
                logits_to_keep=1,
                serge_segments=[(kv, 0, n)],
            )
        except BaseException:
            kv.reserve(0)
            raise
        kv.advance()
        return out.logits[0, -1]


def load_transformers(installed: InstalledModel, options: LoadOptions) -> LocalModel:
    """Load a checkpoint folder with transformers (a GGUF is converted once to safetensors first)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    plan = options.plan
    started = time.monotonic()
    source = installed.transformers_folder()
    log.info("Loading %s with transformers on %s (%s) ...", installed.name, plan.device, plan.dtype_name)
    tokenizer = AutoTokenizer.from_pretrained(source)
    check_chat_template(installed.name, tokenizer)
    model = AutoModelForCausalLM.from_pretrained(source, **plan.load_kwargs())
    model.eval().requires_grad_(False)
    window = getattr(model.config, "max_position_embeddings", None) or 2048
    if options.context_cap:
        window = min(window, options.context_cap)
    max_running = options.limits.running_for(model.device)
    scheduler = Scheduler(BatchForward(model, max_running), tokenizer, eos_ids(tokenizer, model.generation_config),
                          options.threads, installed.name, options.limits, options.metrics)
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
    )


def estimate(facts: ModelFacts, plan: DevicePlan) -> int:
    """Memory the model takes once loaded on `plan`'s device, from its facts (before it is loaded)."""
    if not facts.parameters:
        return facts.weights_bytes * 2
    bytes_per_parameter = {"8bit": 1.0, "4bit": 0.5}.get(plan.quantization, plan.dtype.itemsize)
    packed = 2 if plan.device_type == "cpu" and plan.dtype_name == "float32" else 1  # the oneDNN copy
    return int(facts.parameters * bytes_per_parameter * packed)
