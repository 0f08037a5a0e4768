"""Attention for a whole forward pass over a paged KV cache: one call per layer for every sequence in it.

A pass holds any mix of decodes (one new token each) and prompt chunks, packed
into one row of tokens. `PagedPass` works out, once per pass, where each new
position is written in the `BlockPool`, the block tables, and the masks;
`paged_attention` (called by the batcher's attention) then, per layer, writes the
pass's keys and values into the pool in one indexed copy and runs the decodes as
one batched attention and the prompt chunks as another, each over its sequences'
blocks gathered and padded.

The numbers a row gets depend on its own sequence only: keys are padded to a
multiple of 64 positions and the probabilities meet the values 64 keys at a
time, the parts added in order, so padding only ever adds exact zeros (measured on
this CPU's kernels for lengths to 2,500; `tests/test_paged_attention.py` checks it
against attention run alone, with lengths whose padding differs by many blocks).
On the CPU this path is measured slower than `transformers`' per-sequence attention
over contiguous memory (the gather copies every key and value once more per layer),
which is why it is the GPU's path; see `BatchForward`.
"""

from __future__ import annotations

import torch  # extra: transformers

from serge.engine.hf.paged import PagedKV, tables

ATTENTION = "serge_paged"
_PAD = 64  # keys are padded to a multiple of this many positions


class _Group:
    """Sequences whose queries are attended to together: which rows of the pass they are, their block
    tables, and where each of their query rows may look."""

    def __init__(self, kvs: list[PagedKV], starts: list[int], rows: list[int], device: torch.device) -> None:
        keys = -(-max(kv.length + n for kv, n in zip(kvs, rows)) // _PAD) * _PAD
        self.queries = max(rows)  # query rows per sequence, padded
        self.table = tables(kvs, keys)
        # Row j * queries + i is sequence j's i-th new position; a padded one reads row 0 and sees
        # position 0 only, so its (unused) softmax stays finite.
        index = torch.zeros(len(kvs), self.queries, dtype=torch.long)
        position = torch.zeros(len(kvs), self.queries, dtype=torch.long)
        for j, (kv, start, n) in enumerate(zip(kvs, starts, rows)):
            index[j, :n] = torch.arange(start, start + n)
            position[j, :n] = torch.arange(kv.length, kv.length + n)
        self.valid = (torch.arange(self.queries)[None, :] < torch.tensor(rows)[:, None]).reshape(-1).to(device)
        self.index = index.reshape(-1).to(device)
        self.targets = self.index[self.valid]
        self.position = position.to(device)
        self.key = torch.arange(keys, device=device)
        self._masks: dict[tuple[int, int | None], torch.Tensor] = {}

    def mask(self, group: int, window: int | None) -> torch.Tensor:
        """[sequences, 1, group * queries, keys]: True where a query row sees a key (made once per pass)."""
        if (group, window) not in self._masks:
            key, position = self.key[None, None, :], self.position[:, :, None]
            mask = key <= position
            if window:
                mask &= key > position - window
            self._masks[group, window] = mask[:, None].repeat(1, 1, group, 1)
        return self._masks[group, window]


class PagedPass:
    """One forward pass's plan: built once, read by every layer's `paged_attention`."""

    def __init__(self, kvs: list[PagedKV], rows: list[int]) -> None:
        """`kvs[i]` gets `rows[i]` new positions (reserved), packed one sequence after another."""
        self.pool = kvs[0].pool
        device = self.pool.keys[0].device
        slots = [kv.slots() for kv in kvs]
        self.blocks = torch.cat([b for b, _ in slots])
        self.offsets = torch.cat([o for _, o in slots])
        self.rows = sum(rows)
        starts = [sum(rows[:i]) for i in range(len(rows))]
        self.groups = []
        for members in ([i for i, n in enumerate(rows) if n == 1], [i for i, n in enumerate(rows) if n > 1]):
            if members:
                self.groups.append(_Group([kvs[i] for i in members], [starts[i] for i in members],
                                          [rows[i] for i in members], device))


def plain_sdpa(module, query, key, value, attention_mask, **kwargs):
    """The model run by someone else than the batcher: transformers' own SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def paged_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
                    **kwargs):
    """Called by each attention layer with `serge_pass`, a `PagedPass`; plain SDPA for anyone else."""
    plan: PagedPass | None = kwargs.pop("serge_pass", None)
    if plan is None:
        return plain_sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                          sliding_window=sliding_window, **kwargs)
    if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
        raise NotImplementedError("this model's attention (soft-capping or sinks) is not supported by the batcher")
    layer, pool = module.layer_idx, plan.pool
    heads, dim = query.shape[1], query.shape[3]
    kv_heads = key.shape[1]
    group = heads // kv_heads
    pool.keys[layer][plan.blocks, :, plan.offsets] = key[0, :, : plan.rows].transpose(0, 1)
    pool.values[layer][plan.blocks, :, plan.offsets] = value[0, :, : plan.rows].transpose(0, 1)
    out = query.new_zeros(1, query.shape[2], heads, dim)  # the row plan's dummy rows stay zero
    scale = scaling if scaling is not None else dim ** -0.5
    for g in plan.groups:
        n = g.table.shape[0]
        # [sequences, kv_heads, group * rows, dim]: the query heads sharing a key head are its rows.
        q = query[0, :, g.index].reshape(heads, n, g.queries, dim).transpose(0, 1)
        q = q.reshape(n, kv_heads, group * g.queries, dim)
        k, v = _gathered(pool.keys[layer], g.table), _gathered(pool.values[layer], g.table)
        o = _attend(q, k, v, g.mask(group, sliding_window), scale)
        o = o.reshape(n, heads, g.queries, dim).transpose(1, 2).reshape(n * g.queries, heads, dim)
        out[0, g.targets] = o[g.valid]
    return out, None


def _gathered(store: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """[sequences, kv_heads, positions, head_dim] from the pool's blocks, in each table's order."""
    blocks = store[table]  # [sequences, blocks, kv_heads, block_size, head_dim]
    n, width, heads, size, dim = blocks.shape
    return blocks.transpose(1, 2).reshape(n, heads, width * size, dim)


def _attend(q, k, v, mask, scale) -> torch.Tensor:
    """Softmax attention whose every row's numbers are the same however far its keys are padded (SDPA's
    kernel, and 512-key chunks, gave a row other bits here once two sequences' padding differed)."""
    if q.device.type != "cpu":
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    n, heads, keys, dim = k.shape
    scores = (q @ k.transpose(-1, -2)) * scale
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    blocks = keys // _PAD
    parts = probs.view(n, heads, q.shape[2], blocks, _PAD).transpose(2, 3) @ v.reshape(n, heads, blocks, _PAD, dim)
    return parts.sum(2)
