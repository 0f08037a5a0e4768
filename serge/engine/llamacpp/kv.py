"""One sequence's place in llama.cpp's KV cache: a slice of it while the sequence runs, or its cells parked
in host memory once the prefix cache keeps it (`llama_state_seq_get_data`), copied into a free slice when
its next turn starts.

The copies themselves are `forward.LlamaForward`'s (they need its context); this module knows which a
sequence holds, and how a parked one's memory is taken. It knows nothing of prompts or scheduling.
"""

from __future__ import annotations

import ctypes
import mmap
from typing import Protocol


class Slices(Protocol):
    """What a sequence asks of the context that holds its cells (`forward.LlamaForward`)."""

    bytes_per_token: int

    def new_kv(self) -> LlamaKV: ...

    def park(self, kv: LlamaKV) -> ctypes.Array: ...

    def restore(self, parked: ctypes.Array, target: LlamaKV, length: int) -> None: ...

    def free(self, kv: LlamaKV) -> None: ...


class LlamaKV:
    """One sequence's cells, in the KV cache slice its sequence id names; or, once the
    prefix cache keeps it, its keys and values parked in host memory and no slice at all."""

    def __init__(self, forward: Slices, seq: int | None) -> None:
        self._forward = forward
        self.seq: int | None = seq
        self.length = 0
        self._parked: ctypes.Array | None = None
        self._snapshot: tuple[int, ctypes.Array] | None = None  # (length, cells) parked for copies while it runs

    def copy(self, length: int) -> LlamaKV:
        """A new sequence holding this one's first `length` cells, in a slice of its own: from host memory
        when parked, else through it (the other choices of a request for n, replies sharing its prompt's
        prefix). Copies taken between two passes park it once: parking is most of a copy's cost (figures:
        bench/README.md), so nine followers pay one park, not nine.
        Not `llama_memory_seq_cp`: between slices it copies a whole slice (every cell, used or not), only
        whole ones (a range aborts the process), and only at the next decode."""
        if self._parked is not None:
            parked = self._parked
        else:
            if self._snapshot is None or self._snapshot[0] != self.length:
                self._snapshot = (self.length, self._forward.park(self))
            parked = self._snapshot[1]
        other = self._forward.new_kv()
        try:
            self._forward.restore(parked, other, length)
        except BaseException:  # the slice it took goes back, whatever failed
            other.release()
            raise
        return other

    def shrink(self) -> None:
        """Out of its slice into host memory, for the prefix cache: the slice is free for the next reply."""
        if self.seq is not None:
            self._parked = self._forward.park(self)
            self._forward.free(self)
            self.seq = None
        self._snapshot = None

    @property
    def nbytes(self) -> int:
        return len(self._parked) if self._parked is not None else self.length * self._forward.bytes_per_token

    def release(self) -> None:
        self._parked = self._snapshot = None
        if self.seq is not None:
            self._forward.free(self)
            self.seq = None


def host_pages(size: int) -> ctypes.Array:
    """`size` bytes of private pages of their own, given back to the system when the prefix cache drops them (parked
    conversations of every size, taken from the heap, left it fragmented and growing), and faulted in by one call
    where Linux can (MAP_POPULATE) rather than page by page as llama.cpp writes them (figures: commit a08ed0d)."""
    flags = {"flags": mmap.MAP_PRIVATE | getattr(mmap, "MAP_POPULATE", 0)} if hasattr(mmap, "MAP_PRIVATE") else {}
    return (ctypes.c_uint8 * size).from_buffer(mmap.mmap(-1, max(1, size), **flags))  # Windows: no flags
