"""The `llama_batch` a llama.cpp pass reads, over arrays numpy owns: filled a slice at a time from Python.

llama-cpp-python's `llama_batch_init` gives ctypes arrays that Python fills one element (one
foreign call) at a time, five per token, and a separate allocation per token for its sequence
ids. Here each field is one numpy array that the struct points into, every token has one
sequence id (a slot of `seq_id`), and each sequence of a pass is a few slice assignments (no
foreign call per token). It knows nothing of contexts, KV cache or logits: that is `forward.LlamaForward`'s.
"""

from __future__ import annotations

import ctypes
from typing import Protocol

import numpy as np


class Cells(Protocol):
    """A sequence's place in the KV cache: its sequence id and how many cells it holds."""

    seq: int
    length: int


class LlamaBatch:
    """A `llama_batch` over arrays numpy owns, one sequence id per token: a pass is filled a slice at a time,
    not token by token through ctypes (`llama_batch_init`'s arrays, with an allocation per token's sequence ids)."""

    def __init__(self, lc, size: int) -> None:
        self.token, self.pos, self.seq_id = (np.zeros(size, np.int32) for _ in range(3))
        self.n_seq_id = np.ones(size, np.int32)
        self.logits = np.zeros(size, np.int8)
        ints = ctypes.POINTER(ctypes.c_int32)
        self._ids = (ints * size)(*(ctypes.cast(self.seq_id.ctypes.data + 4 * i, ints) for i in range(size)))
        self.struct = lc.llama_batch(0, self.token.ctypes.data_as(ints), None, self.pos.ctypes.data_as(ints),
                                     self.n_seq_id.ctypes.data_as(ints), ctypes.cast(self._ids, ctypes.POINTER(ints)),
                                     self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)))

    def fill(self, work: list[tuple[Cells, list[int], bool]]) -> None:
        """Each sequence's tokens at its next positions; an output row after its last token where it wants one."""
        n = 0
        for kv, tokens, want_last in work:
            if len(tokens) == 1:  # a decode: numpy's scalar stores, a fifth of the slices' cost
                self.token[n], self.pos[n], self.seq_id[n], self.logits[n] = tokens[0], kv.length, kv.seq, want_last
                n += 1
                continue
            end = n + len(tokens)
            self.token[n:end] = tokens
            self.pos[n:end] = np.arange(kv.length, kv.length + len(tokens))
            self.seq_id[n:end] = kv.seq
            self.logits[n:end] = 0
            self.logits[end - 1] = want_last
            n = end
        self.struct.n_tokens = n
