"""Key/value memory: one sequence's, and the finished ones kept for reuse.

`SequenceKV` holds one sequence's keys and values, one growing buffer per layer,
so sequences of any length can share a forward pass without padding each other.
`PrefixCache` keeps the KV of finished sequences (prompt and reply) under a
memory budget, least recently used first out, so that the next turn of a chat
prefills only what is new. It knows nothing of models or scheduling.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass

import torch

_ROUND = 64  # capacity grows in steps of this many positions


class SequenceKV:
    """Keys and values of one sequence, per layer, as [kv_heads, positions, head_dim]."""

    def __init__(self, layers: int) -> None:
        self.length = 0  # positions whose keys and values are stored
        self._keys: list[torch.Tensor | None] = [None] * layers
        self._values: list[torch.Tensor | None] = [None] * layers
        self._capacity = 0
        self._pending = 0

    def reserve(self, n: int) -> None:
        """Make room for `n` more positions before a forward pass writes them."""
        need = self.length + n
        self._pending = n
        if need <= self._capacity:
            return
        capacity = max(need, self._capacity + self._capacity // 2)
        capacity = -(-capacity // _ROUND) * _ROUND
        for store in (self._keys, self._values):
            for layer, old in enumerate(store):
                if old is not None:
                    new = old.new_empty(old.shape[0], capacity, old.shape[2])
                    new[:, : self.length] = old[:, : self.length]
                    store[layer] = new
        self._capacity = capacity

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this step's keys and values for `layer`; return all of them so far."""
        n = keys.shape[1]
        if n != self._pending:
            raise RuntimeError(f"reserve({n}) was not called before writing {n} positions")
        self._allocate(layer, keys)
        end = self.length + n
        self._keys[layer][:, self.length : end] = keys
        self._values[layer][:, self.length : end] = values
        return self._keys[layer][:, :end], self._values[layer][:, :end]

    def buffers(self, layer: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`layer`'s whole key and value buffers, [kv_heads, capacity, head_dim], for a kernel that writes this
        pass's one position (at `length`) itself; made like `like` ([..., kv_heads, rows, head_dim]) if none yet."""
        if self._pending != 1:
            raise RuntimeError("reserve(1) was not called before a one-position pass")
        self._allocate(layer, like)
        return self._keys[layer], self._values[layer]

    def _allocate(self, layer: int, like: torch.Tensor) -> None:
        """`layer`'s buffers at the reserved capacity, shaped from `like` ([..., kv_heads, rows, head_dim])."""
        if self._keys[layer] is None:
            shape = (like.shape[-3], self._capacity, like.shape[-1])
            self._keys[layer], self._values[layer] = like.new_empty(shape), like.new_empty(shape)

    def advance(self) -> None:
        """The forward pass is done: what it wrote is now part of the sequence."""
        self.length += self._pending
        self._pending = 0

    def copy(self, length: int) -> SequenceKV:
        """A new sequence holding the first `length` positions of this one."""
        other = SequenceKV(len(self._keys))
        other.reserve(length)
        for mine, theirs in ((self._keys, other._keys), (self._values, other._values)):
            for layer, tensor in enumerate(mine):
                if tensor is not None:
                    theirs[layer] = tensor.new_empty(tensor.shape[0], other._capacity, tensor.shape[2])
                    theirs[layer][:, :length] = tensor[:, :length]
        other.advance()
        return other

    def shrink(self) -> None:
        """Give back the room reserved past `length` (before keeping it for long)."""
        if self._capacity == self.length:
            return
        for store in (self._keys, self._values):
            for layer, tensor in enumerate(store):
                if tensor is not None:
                    store[layer] = tensor[:, : self.length].clone()
        self._capacity = self.length

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._keys + self._values if t is not None)

    def release(self) -> None:
        """Nothing to do: the tensors go with the last reference (llama.cpp's KV must be given back)."""


@dataclass
class _Entry:
    ids: list[int]  # the tokens whose keys and values `kv` holds, in order
    kv: SequenceKV
    prompt_length: int  # the first tokens of `ids` were a prompt, whose next-token logits are kept
    prompt_logits: torch.Tensor | None


@dataclass(frozen=True)
class PrefixHit:
    kv: SequenceKV  # its own: a copy, or (paged) shared blocks it copies before writing into
    length: int  # positions reused; the prompt's tokens from here on still need a forward pass
    logits: torch.Tensor | None  # the next-token logits when the whole prompt was found


def _common_prefix(a: list[int], b: list[int]) -> int:
    return len(os.path.commonprefix([a, b]))


class PrefixCache:
    """Finished sequences' KV, found again by the longest common token prefix.

    Chat templates re-render earlier turns, and a reply's tokens as generated may
    differ from the same text tokenized again, so a match is the longest common
    prefix, never an exact key. A prompt equal to a stored one also gets that
    prompt's next-token logits back, so a regeneration needs no forward pass at all.
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._next_key = 0
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def find(self, prompt: list[int]) -> PrefixHit | None:
        """The longest stored prefix of `prompt`, copied, or None."""
        best, best_length = None, 0
        for key, entry in self._entries.items():
            length = _common_prefix(entry.ids, prompt)
            exact = length == len(prompt) == entry.prompt_length and entry.prompt_logits is not None
            if length > best_length or (exact and length == best_length):
                best, best_length = key, length
        if best is None:
            return None
        entry = self._entries[best]
        self._entries.move_to_end(best)
        if entry.prompt_logits is not None and best_length >= len(prompt) == entry.prompt_length:
            return PrefixHit(entry.kv.copy(len(prompt)), len(prompt), entry.prompt_logits)
        usable = min(best_length, len(prompt) - 1)  # the last prompt token must run to give logits
        if usable <= 0:
            return None
        return PrefixHit(entry.kv.copy(usable), usable, None)

    def store(self, ids: list[int], kv: SequenceKV, prompt_length: int, prompt_logits: torch.Tensor | None) -> None:
        """Keep a finished sequence's KV (taken over, not copied), dropping what it makes redundant."""
        ids = ids[: kv.length]
        if not ids:
            kv.release()
            return
        kv.shrink()
        size = kv.nbytes + (prompt_logits.numel() * prompt_logits.element_size() if prompt_logits is not None else 0)
        if size > self.budget_bytes:
            kv.release()
            return
        for key, entry in list(self._entries.items()):
            if len(entry.ids) <= len(ids) and entry.ids == ids[: len(entry.ids)]:
                self._drop(key)  # a prefix of this one: it could only ever match less
        self._entries[self._next_key] = _Entry(ids, kv, prompt_length, prompt_logits)
        self._next_key += 1
        self.nbytes += size
        while self.nbytes > self.budget_bytes and self._entries:
            self._drop(next(iter(self._entries)))

    def evict_oldest(self) -> bool:
        """Drop the least recently used entry, for a KV pool that is short; False when none was left."""
        if not self._entries:
            return False
        self._drop(next(iter(self._entries)))
        return True

    def clear(self) -> None:
        for key in list(self._entries):
            self._drop(key)

    def _drop(self, key: int) -> None:
        entry = self._entries.pop(key)
        logits = entry.prompt_logits
        self.nbytes -= entry.kv.nbytes + (logits.numel() * logits.element_size() if logits is not None else 0)
        entry.kv.release()  # after reading its size: a paged KV holds no block once released
