"""The attention the transformers batcher registers with transformers: each sequence of a packed pass over
its own KV (`per_sequence`: a decode pass on a CPU in float32 in one call of `cpu_attention`'s op, where it
was built), or the whole pass over the paged cache (`paged_attention`); plain SDPA for anyone else running
the model. `decoder.Decoder` calls `per_sequence` directly.

A sequence's attention has the same shapes whether it is alone in its pass or not,
so its numbers are the same either way; only how the queries are laid out and the
outputs gathered differs between a decode pass (one row each) and a prompt chunk.
"""

from __future__ import annotations

import torch  # extra: transformers
import torch.nn.functional as F  # extra: transformers

from serge.engine.hf import cpu_attention
from serge.engine.hf.paged_attention import paged_attention, plain_sdpa

ATTENTION = "serge_batched"


def _attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None, **kwargs):
    """Attention for a packed batch: `paged_attention` when the pass brings a `serge_pass`, else each
    sequence over its own KV (`serge_segments`: (KV, first row, rows) each); plain SDPA for anyone
    else running the model."""
    if "serge_pass" in kwargs:
        return paged_attention(module, query, key, value, attention_mask, dropout, scaling, sliding_window, **kwargs)
    segments = kwargs.pop("serge_segments", None)
    if segments is None:
        return plain_sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                          sliding_window=sliding_window, **kwargs)
    if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
        raise NotImplementedError("this model's attention (soft-capping or sinks) is not supported by the batcher")
    return per_sequence(module.layer_idx, query, key, value, segments, scaling, sliding_window), None


def per_sequence(layer: int, query, key, value, segments, scaling, sliding_window):
    """Each sequence's queries over its own keys, with the same shapes alone or not: `query`
    [1, heads, rows, head_dim], `key`/`value` [1, kv_heads, rows, head_dim]; [1, rows, heads, head_dim]."""
    heads, rows, dim = query.shape[1], query.shape[2], query.shape[3]
    kv_heads = key.shape[1]
    group = heads // kv_heads
    out = query.new_zeros(1, rows, heads, dim)
    kernel = cpu_attention.op() if query.device.type == "cpu" and query.dtype == torch.float32 else None
    if kernel is not None:
        singles = [(kv, start) for kv, start, n in segments if n == 1]  # decodes: rows 0.. of a pass
        if singles:
            _one_call(kernel, layer, query, key, value, singles, scaling, sliding_window, out)
            segments = [segment for segment in segments if segment[2] > 1]
    elif all(n == 1 for _, _, n in segments):  # a decode pass, sequence i on row i: its queries arranged once
        q = query[0].transpose(0, 1).reshape(rows, kv_heads, group, dim)
        outs = []
        for kv, start, _ in segments:
            keys, values = kv.write(layer, key[0, :, start : start + 1], value[0, :, start : start + 1])
            outs.append(F.scaled_dot_product_attention(q[start][None], keys[None], values[None],
                                                       attn_mask=_window(keys.shape[1], 1, sliding_window, 1, q.device),
                                                       scale=scaling))
        out[0, : len(segments)] = torch.cat(outs).reshape(len(segments), heads, dim)
        return out
    for kv, start, n in segments:
        keys, values = kv.write(layer, key[0, :, start : start + n], value[0, :, start : start + n])
        if keys.shape[1] == n and not (sliding_window and n > sliding_window):  # a prompt's first chunk:
            o = F.scaled_dot_product_attention(query[:, :, start : start + n], keys[None], values[None],
                                               is_causal=True, enable_gqa=True, scale=scaling)  # half the work
            out[0, start : start + n] = o[0].transpose(0, 1)
            continue
        # The query heads sharing a key head become rows of one query: no copy of the keys per head.
        q = query[0, :, start : start + n].reshape(kv_heads, group * n, dim).contiguous()
        o = F.scaled_dot_product_attention(q[None], keys[None], values[None],
                                           attn_mask=_window(keys.shape[1], n, sliding_window, group, q.device),
                                           scale=scaling)
        out[0, start : start + n] = o[0].reshape(heads, n, dim).transpose(0, 1)
    return out


def _one_call(kernel, layer: int, query, key, value, singles, scaling, sliding_window, out) -> None:
    """The one-token segments' attention in one call of the CPU op, their rows of `out` written."""
    n, dim = len(singles), query.shape[3]
    rows = [start for _, start in singles]
    buffers = [kv.buffers(layer, key) for kv, _ in singles]
    leading = rows == list(range(n))
    if leading:  # the decodes lead the pass: views, no copies
        q, k, v, o = query[0, :, :n], key[0, :, :n], value[0, :, :n], out[0, :n]
    else:
        index = torch.tensor(rows, device=query.device)
        q, k, v = query[0][:, index], key[0][:, index], value[0][:, index]
        o = out.new_empty(n, out.shape[2], dim)
    kernel(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), [b[0] for b in buffers], [b[1] for b in buffers],
           [kv.length for kv, _ in singles], dim**-0.5 if scaling is None else scaling, sliding_window or 0, o)
    if not leading:
        out[0, index] = o


def _window(length: int, n: int, sliding_window: int | None, group: int, device) -> torch.Tensor | None:
    """Which of `length` keys the last `n` positions' queries (each `group` times) see: None when all
    they may (a lone query without a window reaching back)."""
    if n == 1 and not (sliding_window and length > sliding_window):
        return None
    position = torch.arange(length - n, length, device=device)[:, None]
    key_position = torch.arange(length, device=device)[None, :]
    mask = key_position <= position
    if sliding_window:
        mask &= key_position > position - sliding_window
    return mask.repeat(group, 1)


def install(model) -> None:
    """Route the model's attention through `_attention` (plain SDPA for other callers); a vision model's
    language model only, its vision tower keeping SDPA (it keeps no KV)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(ATTENTION, _attention)
    AttentionMaskInterface.register(ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    text = model.config.get_text_config()
    if text._attn_implementation != ATTENTION:
        if text is model.config:
            model.set_attn_implementation(ATTENTION)
        else:
            model.set_attn_implementation({"": ATTENTION, "text_config": ATTENTION, "vision_config": "sdpa"})
    if text._attn_implementation != ATTENTION:
        raise ValueError(f"{type(model).__name__} does not let its attention be replaced; it cannot be batched")
