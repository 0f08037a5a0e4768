"""Forward passes over many sequences at once, each getting the numbers it would get alone.

Continuous batching must not change what anyone is answered: greedy decoding of
a prompt gives the same text whether it runs alone or beside fifteen others. A
plain batch cannot promise that: the BLAS library picks another kernel, and so
another order of summation, for a matrix of 1 row than for 8, so a row's result
depends on how many rows were beside it, and a near-tie between two tokens can
flip. Here, therefore:

- the sequences being decoded share one forward pass, with their tokens packed
  into one row each (no padding between them);
- at load, the linear layers are measured: which row counts give every row the
  same bits as any other of those counts, on this machine's kernels and thread
  count (`RowPlan`). Every decode batch is padded with dummy rows to such a
  count. On a CPU in float32 the weights are first packed once for oneDNN (a
  second copy of the linear weights in memory), whose kernels measured invariant
  for any count from 2 rows and ran a decode step in 50 ms alone, 72 ms for 8
  sequences and 107 ms for 16 (2 cores); MKL's own kernels needed multiples of 4
  (83, 90 and 122 ms), and running rows in fixed tiles of 2 took 96, 239 and 419 ms;
- attention runs per sequence, over that sequence's own `SequenceKV`, with the
  same shapes whether it is alone or not (an attention function registered with
  transformers; the model's other code is used as is);
- a prompt chunk runs in a forward pass of its own, whose shape depends only on
  that sequence's prompt.

This module knows nothing of streams, sampling or scheduling.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from serge.engine.kvcache import SequenceKV

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


class _PackedLinears(TorchFunctionMode):
    """Within it, `F.linear` on a known weight runs oneDNN's kernel on that weight packed once."""

    def __init__(self, packed: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        super().__init__()
        self._packed = packed

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            entry = self._packed.get(id(args[1]))
            if entry is not None:
                x = args[0]
                bias = args[2] if len(args) > 2 else kwargs.get("bias")
                out = torch.ops.mkldnn._linear_pointwise(
                    x.reshape(-1, x.shape[-1]).contiguous(), entry[1], bias, "none", [], ""
                )
                return out.reshape(*x.shape[:-1], out.shape[-1])
        return func(*args, **kwargs)


def _pack_for_onednn(model) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """oneDNN-packed copies of every linear weight (CPU, float32), or {} where that is unavailable."""
    if model.device.type != "cpu" or model.dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        return {}
    packed = {}
    try:
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and id(module.weight) not in packed:
                weight = module.weight.detach()
                packed[id(module.weight)] = (module.weight, torch.ops.mkldnn._reorder_linear_weight(weight, None))
    except (RuntimeError, AttributeError) as exc:  # a torch build without these ops
        log.info("oneDNN weight packing unavailable (%s); using plain linear layers", exc)
        return {}
    return packed


def _linear_shapes(model) -> list[torch.Tensor]:
    """One weight of each distinct shape (and bias-ness) among the model's linear layers."""
    seen: dict[tuple, torch.nn.Linear] = {}
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            seen.setdefault((tuple(module.weight.shape), module.bias is not None), module)
    return list(seen.values())


@torch.inference_mode()
def measure_rows(model, linear_mode, max_rows: int) -> RowPlan:
    """The cheapest `RowPlan` under which every row of every linear layer gets the same bits
    whatever the batch's size, found by running the model's own weight shapes."""
    modules = _linear_shapes(model)
    top = max(max_rows, 2)
    generator = torch.Generator(device="cpu").manual_seed(0)
    inputs = {
        id(m): torch.randn(top + 32, m.in_features, generator=generator, dtype=m.weight.dtype).to(m.weight.device)
        for m in modules
    }
    for least, step in _ROW_CANDIDATES:
        plan = RowPlan(least, step)
        counts = sorted({plan.rows_for(n) for n in range(1, top + 1)})
        with linear_mode():
            if all(_same_rows(m, inputs[id(m)], counts) for m in modules):
                return plan
    return RowPlan(top, top)  # one fixed shape: always the same kernel


def _same_rows(module: torch.nn.Linear, x: torch.Tensor, counts: list[int]) -> bool:
    largest = F.linear(x[: counts[-1]], module.weight, module.bias)
    return all(torch.equal(F.linear(x[:n], module.weight, module.bias), largest[:n]) for n in counts[:-1])


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

    def _linears(self):
        return _PackedLinears(self._packed) if self._packed else contextlib.nullcontext()

    def prepare(self) -> None:
        if self.rows is None:
            self.rows = measure_rows(self._model, self._linears, self._max_rows)
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
            with self._linears():
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
            with self._linears():
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
