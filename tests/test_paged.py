"""The paged KV cache: blocks taken and given back, prefixes shared by block, copy-on-write, running out."""

from __future__ import annotations

import pytest
import torch

from serge.engine.generation.kv.prefix_cache import PrefixCache
from serge.engine.hf.paged import BlockPool, OutOfBlocks, tables

LAYERS, HEADS, DIM, SIZE = 2, 2, 4, 4


def _pool(blocks: int) -> BlockPool:
    return BlockPool(blocks, LAYERS, HEADS, DIM, torch.float32, block_size=SIZE)


def _feed(kv, start: float, n: int) -> None:
    """Write `n` positions whose every number is its position (plus `start`) in every layer."""
    kv.reserve(n)
    for layer in range(LAYERS):
        marks = torch.arange(n, dtype=torch.float32) + start + kv.length
        keys = marks[None, :, None].expand(HEADS, n, DIM) + layer
        kv.write(layer, keys, -keys)
    kv.advance()


def _marks(kv, layer: int = 0) -> list[float]:
    keys, values = kv.gather(layer, kv.length)
    assert torch.equal(values, -keys)
    return (keys[0, :, 0] - layer).tolist()


def test_a_sequence_takes_blocks_as_it_grows_and_gives_them_all_back_at_once():
    pool = _pool(8)
    kv = pool.new_kv()
    assert pool.free_blocks == 7  # block 0 pads the tables
    _feed(kv, 0, 5)
    assert kv.length == 5 and len(kv.blocks) == 2 and pool.free_blocks == 5
    _feed(kv, 0, 3)
    assert len(kv.blocks) == 2  # 8 positions fill two blocks exactly
    kv.release()
    assert pool.free_blocks == 7 and kv.nbytes == 0


def test_a_sequence_spanning_many_blocks_reads_back_every_position_in_order():
    pool = _pool(40)
    kv = pool.new_kv()
    for chunk in (7, 1, 1, 16, 30, 1, 9):
        _feed(kv, 0, chunk)
    assert kv.length == 65 and len(kv.blocks) == 17
    assert _marks(kv, 0) == list(range(65)) and _marks(kv, 1) == list(range(65))
    assert tables([kv], 80).shape == (1, 20) and tables([kv], 80)[0, 17:].tolist() == [0, 0, 0]


def test_a_copied_prefix_shares_its_blocks_and_writes_into_a_private_copy_of_the_partial_one():
    pool = _pool(10)
    a = pool.new_kv()
    _feed(a, 0, 10)  # blocks: full, full, half
    used = pool.free_blocks
    b = a.copy(10)
    assert b.blocks == a.blocks and pool.free_blocks == used  # nothing copied
    _feed(b, 100, 1)  # position 10 lands in the shared third block: b gets its own
    assert b.blocks[:2] == a.blocks[:2] and b.blocks[2] != a.blocks[2]
    assert pool.free_blocks == used - 1
    assert _marks(a) == list(range(10))
    assert _marks(b) == list(range(10)) + [110.0]
    _feed(a, 200, 1)  # a's third block is its own again: written in place
    assert _marks(a) == list(range(10)) + [210.0] and _marks(b)[-1] == 110.0
    a.release()
    assert _marks(b) == list(range(10)) + [110.0]  # the shared blocks stay with b
    b.release()
    assert pool.free_blocks == 9


def test_the_prefix_cache_reuses_blocks_rather_than_copying_them_and_frees_them_when_dropped():
    pool = _pool(12)
    cache = PrefixCache(budget_bytes=10 * pool.block_bytes)
    kv = pool.new_kv()
    _feed(kv, 0, 9)
    kv.reserve(3)  # room reserved and never written: given back when kept
    kv.reserve(0)
    cache.store(list(range(9)), kv, 5, None)
    assert len(kv.blocks) == 3 and pool.free_blocks == 8
    hit = cache.find(list(range(9)) + [50, 51])
    assert hit.length == 9 and hit.kv.blocks == kv.blocks and pool.free_blocks == 8
    _feed(hit.kv, 0, 2)
    assert pool.free_blocks == 7  # the shared partial block copied for the writer
    hit.kv.release()
    assert cache.evict_oldest() and not cache.evict_oldest()
    assert pool.free_blocks == 11 and cache.nbytes == 0


def test_running_out_of_blocks_raises_and_changes_nothing():
    pool = _pool(5)  # four usable blocks
    a, b = pool.new_kv(), pool.new_kv()
    _feed(a, 0, 8)
    _feed(b, 0, 3)
    with pytest.raises(OutOfBlocks):
        b.reserve(6)  # needs two more blocks, one is free
    assert pool.free_blocks == 1 and len(b.blocks) == 1 and b.length == 3
    shared = a.copy(6)
    with pytest.raises(OutOfBlocks):
        shared.reserve(3)  # the copy-on-write block fits, the one after it does not
    assert pool.free_blocks == 1 and shared.blocks == a.blocks[:2]
    _feed(b, 0, 5)  # what does fit still runs
    assert _marks(b) == list(range(8))


def test_a_reply_copying_the_shared_prefix_of_a_longer_running_one_and_the_leader_never_write_over_each_other():
    """A follower (`generation/shared_prefix.py`) copies the first cells of a leader that has gone further."""
    pool = _pool(12)
    leader = pool.new_kv()
    _feed(leader, 0, 14)  # blocks: full, full, full, half
    follower = leader.copy(10)  # into the third block, which the leader filled past 10
    assert follower.length == 10 and follower.blocks == leader.blocks[:3]
    _feed(follower, 100, 3)
    assert _marks(follower) == list(range(10)) + [110.0, 111.0, 112.0]
    _feed(leader, 200, 2)
    assert _marks(leader) == list(range(14)) + [214.0, 215.0]
    assert follower.blocks[:2] == leader.blocks[:2] and follower.blocks[2] != leader.blocks[2]
    leader.release()
    follower.release()
    assert pool.free_blocks == 11
