"""Prompts that start alike, prefilled once: a starting sequence follows one that already holds its prefix.

Agents send the same long system prompt (their tools) at the head of every conversation; ten arriving
together would each prefill it. Here a sequence that starts while another running one shares a long
token prefix with it (`MIN_SHARED` more than the prefix cache gives) does not prefill that part: it waits,
holding no KV, while that *leader* prefills it, then takes a copy of the leader's first cells (`KV.copy`)
and prefills only the rest. A leader that leaves, or is made to wait, before it holds the shared part
lets its followers go: they start again as any sequence does (own prefill, the prefix cache, or another
leader), so none waits on a reply that will not come.

`SharedPrefixes` keeps who follows whom and hands the copies over before each step; the scheduler decides
who follows (`scheduler.Scheduler._start`) and lends its verbs to start and end a reply. It knows nothing
of the queue, streams or passes.
Images are never shared: their placeholder ids are the same for any picture.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from serge.engine.generation.forward import Forward
from serge.engine.generation.batching.sequence import Sequence
from serge.engine.generation.stream import FinishReason
from serge.engine.metrics import ModelMetrics

log = logging.getLogger(__name__)

# Fewest tokens worth following for (beyond what the prefix cache gives); below this a sequence prefills on its
# own. A copy of a llama.cpp slice goes through host memory (`LlamaKV.copy`, a park once for every copy taken
# between two passes, then a restore each), which costs about what prefilling 64 tokens does on an idle CPU:
# a lone follower of 64 breaks about even, more followers gain more (figures: bench/README.md).
MIN_SHARED = 64


@dataclass(frozen=True)
class Follower:
    seq: Sequence
    leader: Sequence
    length: int  # the leader's first cells it takes: its prompt's shared tokens, never its last


def shared_length(a: list[int], b: list[int]) -> int:
    return len(os.path.commonprefix([a, b]))


class SharedPrefixes:
    """Who follows whom (the scheduler's worker thread's alone)."""

    def __init__(self, forward: Forward, metrics: ModelMetrics) -> None:
        self._forward = forward
        self._m = metrics
        self._following: list[Follower] = []

    def __len__(self) -> int:
        return len(self._following)

    def leader_for(self, seq: Sequence, running: list[Sequence], cached: int) -> Follower | None:
        """The running sequence whose KV holds, or is being filled with, the longest prefix of `seq`'s context,
        when that is at least `MIN_SHARED` tokens more than the `cached` ones the prefix cache would give."""
        if seq.images is not None:
            return None
        context = seq.context()
        best, length = None, 0
        for other in running:
            if other is seq or other.kv is None or other.images is not None:
                continue  # a follower or a choice waits for its prompt: it holds nothing to copy
            n = shared_length(other.context(), context)
            if n > length:
                best, length = other, n
        length = min(length, len(context) - 1)  # its last token runs in its own pass: it gives the logits
        if best is None or length < MIN_SHARED or length - cached < MIN_SHARED:
            return None
        return Follower(seq, best, length)

    def follow(self, follower: Follower) -> None:
        self._following.append(follower)

    def due(self, running: list[Sequence]) -> tuple[list[Follower], list[Sequence]]:
        """Followers whose leader now holds their part (to copy), and those whose leader is gone (to start
        again); both forgotten here. A follower no longer running (cancelled while it waited) is forgotten."""
        ready, orphans, kept = [], [], []
        for f in self._following:
            if f.seq not in running or f.seq.kv is not None:
                continue
            if f.leader not in running or f.leader.kv is None:
                orphans.append(f.seq)
            elif f.leader.prefilled >= f.length:
                ready.append(f)
            else:
                kept.append(f)
        self._following = kept
        return ready, orphans

    def hand_over(self, running: list[Sequence], start: Callable[[Sequence], None],
                  leave: Callable[..., None]) -> None:
        """Before a step: each follower whose leader now holds its shared prefix takes a copy of it (and so
        prefills only the rest); one whose leader left or was made to wait starts again (`start`). A copy that
        fails leaves that reply to prefill it all itself, or, with no room for that either, ends it (`leave`)."""
        ready, orphans = self.due(running)
        for seq in orphans:
            start(seq)
        handed: dict[Sequence, list[int]] = {}
        for f in ready:
            try:
                f.seq.kv = f.leader.kv.copy(f.length)
            except Exception:
                log.exception("could not copy a shared prompt prefix: the reply prefills it itself")
                try:
                    f.seq.kv = self._forward.new_kv()
                except Exception as exc:
                    leave(f.seq, FinishReason.ERROR, f"{type(exc).__name__}: {exc}")
                continue
            f.seq.prefilled = f.length
            if not f.seq.resumed:
                f.seq.cached = f.length  # its record's cached tokens: not run for it
            self._m.shared_tokens.inc(f.length)
            handed.setdefault(f.leader, []).append(f.length)
        for lengths in handed.values():
            log.info("shared prompt prefix: %d tokens prefilled once for %d replies", max(lengths), 1 + len(lengths))
