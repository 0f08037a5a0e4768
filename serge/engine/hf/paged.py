"""A paged KV cache: keys and values in fixed-size blocks of one preallocated pool, a block table per sequence.

`BlockPool` holds, per layer, one key and one value tensor of `blocks` blocks of
`block_size` positions each, and a reference count per block. `PagedKV` is one
sequence's view of it (the `forward.KV` protocol): the blocks it reads, in order.
Copying a sequence's prefix (a prefix-cache hit) shares its blocks rather than
copying them; a shared block is copied only when a sequence writes into it
(copy-on-write of a shared last, partial block). Blocks go back to the pool the
moment a sequence is released. When none is free, `reserve` raises `OutOfBlocks`
and changes nothing, so the scheduler can make a reply wait.

Block 0 is never handed out: it stays zero and pads block tables (see `tables`).
This module knows nothing of models, attention or scheduling.
"""

from __future__ import annotations

import torch  # extra: transformers

from serge.engine.generation.forward import OutOfKV

BLOCK_SIZE = 16  # positions per block


class OutOfBlocks(OutOfKV):
    """Every block of the pool is in use."""


class BlockPool:
    """Per layer, keys and values as [blocks, kv_heads, block_size, head_dim]; block 0 is the zero pad."""

    def __init__(self, blocks: int, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu", block_size: int = BLOCK_SIZE) -> None:
        if blocks < 2:
            raise ValueError("a pool needs at least two blocks (block 0 pads the tables)")
        self.block_size = block_size
        shape = (blocks, kv_heads, block_size, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self._refs = [0] * blocks
        self._free = list(range(blocks - 1, 0, -1))  # popped from the end: lowest first
        self.block_bytes = 2 * layers * kv_heads * block_size * head_dim * self.keys[0].element_size()

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def total_blocks(self) -> int:
        return len(self._refs) - 1

    def refs(self, block: int) -> int:
        return self._refs[block]

    def take(self) -> int:
        if not self._free:
            raise OutOfBlocks(f"all {self.total_blocks} KV blocks of {self.block_size} positions are in use")
        block = self._free.pop()
        self._refs[block] = 1
        return block

    def share(self, block: int) -> None:
        self._refs[block] += 1

    def drop(self, block: int) -> None:
        self._refs[block] -= 1
        if self._refs[block] == 0:
            self._free.append(block)

    def copy_block(self, source: int, target: int) -> None:
        for store in (self.keys, self.values):
            for layer in store:
                layer[target].copy_(layer[source])

    def new_kv(self) -> PagedKV:
        return PagedKV(self)


class PagedKV:
    """One sequence's blocks in a `BlockPool`: position p is at block `blocks[p // size]`, offset `p % size`."""

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.blocks: list[int] = []
        self.length = 0
        self._pending = 0
        self._released = False

    def reserve(self, n: int) -> None:
        """Make the next `n` positions writable: new blocks, and a private copy of a shared block
        they would write into. Raises `OutOfBlocks` with nothing changed when the pool is short."""
        if self._released:
            raise RuntimeError("a released KV was reserved: the protocol says it is never used again")
        pool, size = self.pool, self.pool.block_size
        taken: list[int] = []
        try:
            first = self.length // size  # the block the first new position lands in
            private = None
            if n and first < len(self.blocks) and pool.refs(self.blocks[first]) > 1:
                private = pool.take()
                taken.append(private)
            need = -(-(self.length + n) // size) - len(self.blocks)
            for _ in range(max(0, need)):
                taken.append(pool.take())
        except OutOfBlocks:
            for block in taken:
                pool.drop(block)
            raise
        if private is not None:
            pool.copy_block(self.blocks[first], private)
            pool.drop(self.blocks[first])
            self.blocks[first] = private
            taken = taken[1:]
        self.blocks.extend(taken)
        self._pending = n

    def slots(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The (block, offset) of each position being written, as two index tensors."""
        size = self.pool.block_size
        positions = range(self.length, self.length + self._pending)
        device = self.pool.keys[0].device
        blocks = torch.tensor([self.blocks[p // size] for p in positions], device=device)
        return blocks, torch.tensor([p % size for p in positions], device=device)

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store `keys`/`values` ([kv_heads, n, head_dim]) at the reserved positions; return every
        position's so far as [kv_heads, positions, head_dim] (gathered: a copy)."""
        if keys.shape[1] != self._pending:
            raise RuntimeError(f"reserve({keys.shape[1]}) was not called before writing {keys.shape[1]} positions")
        blocks, offsets = self.slots()
        self.pool.keys[layer][blocks, :, offsets] = keys.transpose(0, 1)
        self.pool.values[layer][blocks, :, offsets] = values.transpose(0, 1)
        end = self.length + self._pending
        return self.gather(layer, end)

    def gather(self, layer: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        table = torch.tensor(self.blocks[: -(-length // self.pool.block_size)], device=self.pool.keys[0].device)
        k, v = (store[layer][table] for store in (self.pool.keys, self.pool.values))
        heads, dim = k.shape[1], k.shape[3]
        k = k.transpose(0, 1).reshape(heads, -1, dim)[:, :length]
        v = v.transpose(0, 1).reshape(heads, -1, dim)[:, :length]
        return k, v

    def advance(self) -> None:
        self.length += self._pending
        self._pending = 0

    def copy(self, length: int) -> PagedKV:
        """A sequence holding this one's first `length` positions, sharing their blocks (no copy)."""
        other = PagedKV(self.pool)
        other.blocks = self.blocks[: -(-length // self.pool.block_size)]
        for block in other.blocks:
            self.pool.share(block)
        other.length = length
        return other

    def shrink(self) -> None:
        """Give back the blocks reserved past `length`."""
        keep = -(-self.length // self.pool.block_size)
        for block in self.blocks[keep:]:
            self.pool.drop(block)
        del self.blocks[keep:]
        self._pending = 0

    @property
    def nbytes(self) -> int:
        return len(self.blocks) * self.pool.block_bytes

    def release(self) -> None:
        """Give every block back (a shared one stays with its other holders)."""
        if self._released:
            return
        for block in self.blocks:
            self.pool.drop(block)
        self.blocks = []
        self._released = True


def tables(kvs: list[PagedKV], length: int) -> torch.Tensor:
    """Block tables as one [len(kvs), ceil(length / block_size)] tensor, padded with block 0."""
    pool = kvs[0].pool
    width = -(-length // pool.block_size)
    rows = [kv.blocks[:width] + [0] * (width - min(width, len(kv.blocks))) for kv in kvs]
    return torch.tensor(rows, dtype=torch.long, device=pool.keys[0].device)
