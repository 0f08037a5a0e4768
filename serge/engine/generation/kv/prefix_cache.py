"""Finished sequences' key/value memory, kept for reuse.

`PrefixCache` keeps the KV of finished sequences (prompt and reply) under a
memory budget, least recently used first out, so that the next turn of a chat
prefills only what is new. It knows nothing of models or scheduling.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from serge.engine.generation.forward import KV

if TYPE_CHECKING:
    import numpy as np
    import torch  # extra: transformers


@dataclass
class _Entry:
    ids: list[int]  # the tokens whose keys and values `kv` holds, in order
    kv: KV
    prompt_length: int  # the first tokens of `ids` were a prompt, whose next-token logits are kept
    prompt_logits: torch.Tensor | np.ndarray | None


@dataclass(frozen=True)
class PrefixHit:
    kv: KV  # its own: a copy, or (paged) shared blocks it copies before writing into
    length: int  # positions reused; the prompt's tokens from here on still need a forward pass
    logits: torch.Tensor | np.ndarray | None  # the next-token logits when the whole prompt was found


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

    def held(self, prompt: list[int]) -> int:
        """How many of `prompt`'s first tokens one entry holds, the most of any (nothing copied, nothing moved)."""
        return max((_common_prefix(entry.ids, prompt) for entry in self._entries.values()), default=0)

    def find(self, prompt: list[int]) -> PrefixHit | None:
        """The longest stored prefix of `prompt`, copied, or None."""
        best, best_length = self._best(prompt)
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

    def reusable(self, prompt: list[int]) -> int:
        """Positions `find` would give for `prompt`, without copying anything."""
        best, best_length = self._best(prompt)
        if best is None:
            return 0
        entry = self._entries[best]
        if entry.prompt_logits is not None and best_length >= len(prompt) == entry.prompt_length:
            return len(prompt)
        return max(0, min(best_length, len(prompt) - 1))

    def _best(self, prompt: list[int]) -> tuple[int | None, int]:
        best, best_length = None, 0
        for key, entry in self._entries.items():
            length = _common_prefix(entry.ids, prompt)
            exact = length == len(prompt) == entry.prompt_length and entry.prompt_logits is not None
            if length > best_length or (exact and length == best_length):
                best, best_length = key, length
        return best, best_length

    def entries(self) -> list[tuple[list[int], KV, int, torch.Tensor | np.ndarray | None]]:
        """Each entry's tokens, KV, prompt length and prompt logits, least recently used first (what `store` takes)."""
        return [(e.ids, e.kv, e.prompt_length, e.prompt_logits) for e in self._entries.values()]

    def store(self, ids: list[int], kv: KV, prompt_length: int,
              prompt_logits: torch.Tensor | np.ndarray | None) -> None:
        """Keep a finished sequence's KV (taken over, not copied), dropping what it makes redundant."""
        ids = ids[: kv.length]
        if not ids:
            kv.release()
            return
        kv.shrink()
        size = kv.nbytes + (prompt_logits.nbytes if prompt_logits is not None else 0)
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
        self.nbytes -= entry.kv.nbytes + (logits.nbytes if logits is not None else 0)
        entry.kv.release()  # after reading its size: a paged KV holds no block once released
