"""The forward protocol: what the `Scheduler` asks of a model's forward passes, and of one sequence's KV.

Three forwards implement it: transformers' (`hf.forward.BatchForward` over
`hf.kv.SequenceKV`), llama.cpp's (`llamacpp.forward.LlamaForward` over `LlamaKV`)
and the tests' stand-in (`tests/standin.py`). Everything above it (sampling,
grammars, tools, stop strings, streams, prefix reuse, admission, metrics) is one
piece of code for all of them. This module only writes the contract down; it runs nothing.

Every call is made on the scheduler's worker thread, one at a time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import numpy as np
    import torch  # extra: transformers


class OutOfKV(RuntimeError):
    """No room is left for more keys and values (a paged pool with no free block). Raised by
    `decode`/`prefill` with every sequence's `length` as it was; the scheduler then frees the
    prefix cache and, if that is not enough, makes the youngest reply wait (never fail)."""


class KV(Protocol):
    """One sequence's keys and values, as the scheduler and `prefix_cache.PrefixCache` use them."""

    @property
    def length(self) -> int:
        """Positions held: every token fed to the sequence by a pass that succeeded."""
        ...

    def copy(self, length: int) -> KV:
        """A new, independent sequence holding this one's first `length` positions: a prefix-cache hit, or,
        while this one runs, its prompt for the other choices of a request for n."""
        ...

    def shrink(self) -> None:
        """Give back what is held beyond `length` (room reserved, a device slot) before being kept for long."""
        ...

    @property
    def nbytes(self) -> int:
        """Memory it holds, for the prefix cache's budget."""
        ...

    def release(self) -> None:
        """Done with for good: free what must be given back (a llama.cpp slice); never used again."""
        ...


class Forward(Protocol):
    """A model's forward passes over sequences that each keep their own `KV`.

    A pass that raises leaves each sequence's `length` as it was, so the scheduler
    can end those sequences and keep serving the others.
    """

    @property
    def device(self) -> torch.device:
        """Where the logits live: the scheduler samples there (`host_sampling.HOST`: numpy rows in host memory,
        sampled without torch)."""
        ...

    def prepare(self) -> None:
        """Before the first pass, on the worker thread (its thread pool, a measurement of its kernels)."""
        ...

    def thread_counts(self, most: int) -> list[int]:
        """After `prepare`: the counts of `threads.ladder(most)` whose passes give every row the bits it gets
        at `most` (at least `[most]`), which `threads.Threads` may switch between while the machine is busy."""
        ...

    def set_threads(self, n: int) -> None:
        """Run the coming passes on `n` threads, one of `thread_counts`."""
        ...

    def new_kv(self) -> KV:
        """An empty sequence; may raise when no room is left for one (the reply then fails alone)."""
        ...

    def decode(self, kvs: list[KV], tokens: list[int]) -> torch.Tensor | np.ndarray:
        """Feed `tokens[i]` to `kvs[i]`, each one position longer after; next-token logits
        as [len(kvs), vocabulary], one row per sequence in the callers' order, each row what
        that sequence would get alone. The rows may be a view of the forward's own buffer, good
        until its next pass (llama.cpp's): sample them before running another. A forward whose
        logits are float32 in host memory may give them as a numpy array (llama.cpp's): a greedy
        reply's step then makes no torch call, whose first after a pass is costly (the weights
        have just gone through the caches)."""
        ...

    joins: int
    """Prompt tokens one pass may hold beside every decode and other prompts' chunks (`run`); 0 where the
    forward does not join them (llama.cpp's, whose greedy replies were measured against passes apart)."""

    def run(self, kvs: list[KV], chunks: list[list[int]]) -> torch.Tensor | np.ndarray:
        """Only where `joins`: feed `chunks[i]` to `kvs[i]` in one pass (decodes as one-token chunks, prompt
        chunks of up to `joins` tokens in all); the next-token logits after each chunk's last token, as
        [len(kvs), vocabulary], each row what that chunk gets in a pass of its own."""
        ...

    def prefill(self, kv: KV, tokens: list[int], images: dict | None = None) -> torch.Tensor | np.ndarray:
        """Feed a chunk of one sequence's prompt (`kv.length` grows by `len(tokens)`);
        the next-token logits after its last token, as [vocabulary]. `images`: a vision model's
        pixel inputs for the image tokens in `tokens` (the scheduler passes them with a prompt's
        whole first pass, and only to a forward whose model sees images)."""
        ...

    def close(self) -> None:
        """After the last pass, on the worker thread: free what the forward holds."""
        ...
