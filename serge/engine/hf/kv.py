"""One sequence's keys and values on the transformers engine: one growing buffer per layer.

So sequences of any length can share a forward pass without padding each other. It knows
nothing of scheduling; the prefix cache keeps finished ones (`generation/prefix_cache.py`).
"""

from __future__ import annotations

import torch  # extra: transformers

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
