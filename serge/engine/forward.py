"""Forward passes over many sequences at once, each getting the numbers it would get alone.

Continuous batching must not change what anyone is answered: greedy decoding of
a prompt gives the same text whether it runs alone or beside fifteen others. A
plain padded batch cannot promise that on a CPU: the BLAS library picks another
kernel and another order of summation for a matrix of 1 row than for 8, so a
row's float32 result depends on how many rows were beside it, and a near-tie
between two tokens can flip. Here, therefore:

- the sequences being decoded share one forward pass, with their tokens packed
  into one row each (no padding), and every linear layer runs on tiles of a fixed
  number of rows (zero-filled at the end), so a row always meets the same kernel,
  whatever else is in the batch. On a CPU the tile is 2 rows: MKL runs 2 rows as
  fast as 1 (measured: 82 ms a step alone, as plain generate()'s 72 ms, where a
  16-row tile took 158 ms), at some cost when many run (8 at once: 218 ms a step
  against 182 ms). On a GPU, where 32 rows cost about what 1 does, it is 32;
- attention runs per sequence, over that sequence's own `SequenceKV`, with the
  same shapes whether it is alone or not (an attention function registered with
  transformers; the model's other code is used as is);
- a prompt chunk runs in a forward pass of its own, whose shape depends only on
  that sequence's prompt.

This module knows nothing of streams, sampling or scheduling.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from serge.engine.kvcache import SequenceKV

CPU_TILE = 2
ACCELERATOR_TILE = 32  # not measured yet
ATTENTION = "serge_per_sequence"


class _RowTiles(TorchFunctionMode):
    """Within it, every `F.linear` runs on fixed-size tiles of rows."""

    def __init__(self, tile: int) -> None:
        super().__init__()
        self._tile = tile

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.linear:
            return func(*args, **kwargs)
        x, weight = args[0], args[1]
        bias = args[2] if len(args) > 2 else kwargs.get("bias")
        rows = x.reshape(-1, x.shape[-1])
        n, tile = rows.shape[0], self._tile
        padded = -(-n // tile) * tile
        rows = torch.cat([rows, rows.new_zeros(padded - n, rows.shape[1])]) if padded != n else rows.contiguous()
        out = torch.cat([F.linear(rows[i : i + tile], weight, bias) for i in range(0, padded, tile)])
        return out[:n].reshape(*x.shape[:-1], out.shape[-1])


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
    out = query.new_empty(1, rows, heads, dim)
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
    """The model's forward passes, for sequences that each keep their own `SequenceKV`."""

    def __init__(self, model, decode_tile: int | None = None) -> None:
        _install(model)
        self._model = model
        self._tile = decode_tile or (CPU_TILE if model.device.type == "cpu" else ACCELERATOR_TILE)
        self._layers = model.config.get_text_config().num_hidden_layers

    def new_kv(self) -> SequenceKV:
        return SequenceKV(self._layers)

    @torch.inference_mode()
    def decode(self, kvs: list[SequenceKV], tokens: list[int]) -> torch.Tensor:
        """Feed one token to each sequence; next-token logits, one row per sequence."""
        device = self._model.device
        positions = torch.tensor([[kv.length for kv in kvs]], device=device)
        for kv in kvs:
            kv.reserve(1)
        segments = [(kv, i, 1) for i, kv in enumerate(kvs)]
        try:
            with _RowTiles(self._tile):
                out = self._model(
                    input_ids=torch.tensor([tokens], device=device),
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
        return out.logits[0]

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
