"""A scheduler step's work over the sequences that run: one decode pass, prompt chunks, and sampling.

`Step` runs a step for its `scheduler.Scheduler` once the worker has admitted and started what fits: every decoding sequence's token in one `Forward.decode` and their next tokens
sampled at once from its rows (before any other pass, which may reuse the forward's buffer), then
prompt chunks, each prompt's first token sampled as soon as its last chunk has run (the readers
woken with the news so far before each chunk's pass, not at the step's end), then the
sequences given logits otherwise (a prefix-cache hit, another choice's prompt) sampled at once.
A forward that `joins` runs the decodes and the chunks in shared passes of up to that many prompt
tokens instead (`Forward.run`): one pass reads the weights once for all of them.
A failure ends its sequence alone. What a step may change of the batch it asks its owner (`Batch`):
take a sequence out (`leave`), make KV room (`make_room`), give a prompt's KV to its other choices
(`share`). It knows nothing of the queue, the worker thread or the prefix cache's policy: those are
the scheduler's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from typing import TYPE_CHECKING

import numpy as np

from serge.engine.generation.forward import Forward, OutOfKV
from serge.engine.generation.batching.sequence import Sequence, choose_all
from serge.engine.generation.stream import FinishReason
from serge.engine.generation.batching.threads import Threads
from serge.engine.generation.batching.wakeups import Wakeups
from serge.engine.metrics import ModelMetrics

if TYPE_CHECKING:
    import torch  # extra: transformers

log = logging.getLogger(__name__)


MOST_CHUNKS = 8  # prompt chunks a step beside decoding replies: 2048 tokens at the default chunk
# Token gaps held for the inter-token histogram before they are observed together: an observation is cheap in a
# loop and dear alone between passes (the weights have just passed through the caches). Held gaps are observed
# before a reply's stream ends, so the metrics are whole for every finished reply.
GAPS_HELD = 64


def failure_message(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def kept(row: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
    """A pass's row as an array of its own, not a view of the pass's rows: kept past the next pass (a host
    forward's stays a numpy array, sampled without torch)."""
    return row.copy() if isinstance(row, np.ndarray) else row.clone()


@dataclass(frozen=True)
class Batch:
    """The batch a step works on, and the scheduler's verbs that change it (the worker thread's alone)."""

    running: list[Sequence]  # the scheduler's list, as it is now: a step reads it, the verbs change it
    leave: Callable[..., None]  # (seq, reason, error=None): out of the batch now, its stream ended
    make_room: Callable[..., bool]  # (exc, failing=None): KV room made (False: `failing`, or all, ended)
    share: Callable[[Sequence], None]  # choice 0's prompt is in: its other choices take a copy


class Step:
    """One step of the worker's loop over `batch` (made on the worker thread, used there alone)."""

    def __init__(self, forward: Forward, batch: Batch, chunk: int, metrics: ModelMetrics, threads: Threads,
                 wakeups: Wakeups) -> None:
        self.forward = forward
        self._running = batch.running
        self._leave, self._make_room, self._share = batch.leave, batch.make_room, batch.share
        self._chunk = chunk
        self._m = metrics
        self._threads = threads
        self._wakeups = wakeups
        self._gaps: list[float] = []  # seconds between tokens, not yet observed (`GAPS_HELD`)
        self._tokens = 0  # generated since the gaps were last observed, not yet counted

    def __call__(self) -> None:
        for seq in [s for s in self._running if s.stream.cancelled]:
            self.observe_gaps()
            self._leave(seq, FinishReason.CANCELLED)
        decoding = [s for s in self._running if s.feed is not None and s.prefilled >= s.context_length]
        chunks = self._chunks(len(decoding))
        if self.forward.joins and chunks:
            self._joined(decoding, chunks)
        else:
            self._decode(decoding)
            self._run_apart(chunks)
        if ready := [s for s in self._running if s.logits is not None]:
            for seq, choice in zip(ready, choose_all(ready)):
                self._sample(seq, choice)
        if len(self._gaps) >= GAPS_HELD or not self._running:
            self.observe_gaps()

    def observe_gaps(self) -> None:
        """The held token gaps into the inter-token histogram, and their tokens into the count."""
        gaps, tokens, self._gaps, self._tokens = self._gaps, self._tokens, [], 0
        for gap in gaps:
            self._m.inter_token.observe(gap)
        if tokens:
            self._m.generated_tokens.inc(tokens)

    def _decode(self, decoding: list[Sequence]) -> None:
        """One pass feeding every decoding sequence its token, their next tokens sampled at once."""
        while decoding:
            try:
                with self._threads.decode(len(decoding)):
                    rows = self.forward.decode([s.kv for s in decoding], [s.feed for s in decoding])
            except OutOfKV as exc:
                if not self._make_room(exc):
                    return
                decoding = [s for s in decoding if s in self._running]
            except Exception as exc:
                log.exception("decode step failed")
                for seq in decoding:
                    self._leave(seq, FinishReason.ERROR, failure_message(exc))
                return
            else:
                self._decoded(decoding, rows)
                return

    def _decoded(self, decoding: list[Sequence], rows: torch.Tensor | np.ndarray) -> None:
        for seq in decoding:
            seq.feed = None
        for seq, choice in zip(decoding, choose_all(decoding, rows)):  # before another pass reuses `rows`
            self._sample(seq, choice)

    def _chunks(self, decoding: int) -> list[tuple[Sequence, list[int], dict | None]]:
        """This step's prompt chunks (sequence, tokens, pixel inputs), oldest request first, a chunk each:
        every waiting prompt's when no reply is being decoded (nobody to stall); while `decoding` are,
        a chunk for each prompt waiting per decoding reply, at least one and at most `MOST_CHUNKS`. So a
        long prompt stalls the replies for a chunk a step, and a crowd arriving beside a few replies is
        prefilled in a step or two rather than one prompt a step behind a decode each (its first tokens
        sooner for the same work). Where the forward `joins`, the decodes ride in the prompts' pass, so the
        crowd's chunks are not rationed per decoding reply: a chunk for each waiting prompt, up to
        `MOST_CHUNKS`, in one pass (the replies wait as long for the same work, in fewer, longer steps, and
        the crowd's first tokens come sooner; figures: bench/README.md).

        A chunk always starts where the sequence's last one ended and is never cut
        to fit the budget: its shape, and so its numbers, depend on that sequence alone.
        """
        prompts = [s for s in self._running if s.kv is not None and s.prefilled < s.context_length]
        per_reply = len(prompts) if self.forward.joins else len(prompts) // max(decoding, 1)
        budget = self._chunk * min(MOST_CHUNKS, max(1, per_reply)) if decoding else None
        chunks = []
        for seq in prompts:
            pixels = seq.images if seq.prefilled == 0 else None  # with its first pass, which runs it all
            n = seq.context_length - seq.prefilled if pixels else min(self._chunk, seq.context_length - seq.prefilled)
            if budget is not None and n > budget and budget < self._chunk:
                break
            chunks.append((seq, seq.context()[seq.prefilled : seq.prefilled + n], pixels))
            if budget is not None:
                budget -= n
                if budget <= 0:
                    break
        return chunks

    def _joined(self, decoding: list[Sequence], chunks: list[tuple[Sequence, list[int], dict | None]]) -> None:
        """The decodes and prompt chunks in shared passes of up to `forward.joins` prompt tokens (the decodes
        in the first), each prompt's first token sampled as soon as its pass has run. A vision prompt's
        first pass runs apart; a joined pass that fails runs again as its parts apart, so a failure ends
        only the sequences it belongs to and a full KV pool is met as in passes apart."""
        groups: list[list] = []
        tokens = 0  # in the last group
        for chunk in (c for c in chunks if c[2] is None):
            if not groups or tokens + len(chunk[1]) > self.forward.joins:
                groups.append([])
                tokens = 0
            groups[-1].append(chunk)
            tokens += len(chunk[1])
        if not groups:
            self._decode(decoding)
        for group in groups:
            group = [chunk for chunk in group if chunk[0] in self._running]  # not made to wait by a pass before
            self._wakeups.send()  # the news so far (a first token) is not held behind this pass
            try:
                rows = self.forward.run([s.kv for s in decoding] + [seq.kv for seq, _, _ in group],
                                        [[s.feed] for s in decoding] + [ids for _, ids, _ in group])
            except Exception as exc:
                if not isinstance(exc, OutOfKV):
                    log.warning("a joined pass failed (%s): its parts run apart", failure_message(exc))
                self._decode(decoding)
                self._run_apart(group)
            else:
                self._decoded(decoding, rows[: len(decoding)])
                for (seq, ids, _), logits in zip(group, rows[len(decoding) :]):
                    self._chunk_ran(seq, len(ids), kept(logits))
            decoding = []
        self._run_apart([chunk for chunk in chunks if chunk[2] is not None])

    def _run_apart(self, chunks: list[tuple[Sequence, list[int], dict | None]]) -> None:
        """Each prompt chunk in a pass of its own, the readers woken with the news so far before each."""
        for seq, ids, pixels in chunks:
            if seq not in self._running:  # made to wait for KV room, or ended, by a pass before
                continue
            self._wakeups.send()
            try:
                logits = self.forward.prefill(seq.kv, ids, pixels) if pixels else self.forward.prefill(seq.kv, ids)
            except OutOfKV as exc:
                self._make_room(exc, seq)
                return  # the next step tries again, with the room made
            except Exception as exc:
                log.exception("prefill failed")
                self._leave(seq, FinishReason.ERROR, failure_message(exc))
                continue
            self._chunk_ran(seq, len(ids), logits)

    def _chunk_ran(self, seq: Sequence, n: int, logits: torch.Tensor | np.ndarray) -> None:
        seq.prefilled += n
        self._m.prefilled_tokens.inc(n)
        if seq.prefilled == seq.context_length and not seq.resumed:
            seq.logits = seq.prompt_logits = logits
            self._share(seq)
            self._sample(seq)

    def _sample(self, seq: Sequence, choice: tuple[int, torch.Tensor | None] | Exception | None = None) -> None:
        """Act on the sequence's next token (`choice`, or picked now); a failure ends that sequence alone."""
        try:
            if isinstance(choice, Exception):
                raise choice
            self._next_token(seq, choice)
        except Exception as exc:
            if seq in self._running:
                self._leave(seq, FinishReason.ERROR, failure_message(exc))

    def _next_token(self, seq: Sequence, choice: tuple[int, torch.Tensor | None] | None) -> None:
        logits, seq.logits = seq.logits, None
        token, logprobs = choice if choice is not None else seq.choose(logits)
        before, count = seq.last_token, len(seq.generated)
        reason = seq.accept(token, logprobs)
        if before is None:
            self._m.ttft.observe(seq.first_token - seq.stream.created)
        else:
            self._gaps.append(seq.last_token - before)
        self._tokens += len(seq.generated) - count
        if reason is not None:
            self.observe_gaps()  # before its stream ends: a reader who then reads the metrics finds it whole
            self._leave(seq, reason)

