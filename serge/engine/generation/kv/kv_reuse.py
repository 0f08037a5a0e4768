"""A reply's KV reused across replies: taken from others when it starts, kept for others when it leaves.

A starting reply takes, instead of prefilling it, the longest part of its context that is already computed:
the prefix cache's best match (with the prompt's next-token logits, when the whole prompt was there), a
copy of the prompt prefix a running reply prefills or holds (`shared_prefix`: it waits for that one), or,
for choices 1..n-1 of one request, choice 0's prompt. A reply that leaves, or gives its slot back, keeps
its KV in the prefix cache for the chat's next turn or its own return. The scheduler decides when; this
decides from where and to where.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from serge.engine.generation.forward import Forward
from serge.engine.generation.batching.passes import failure_message
from serge.engine.generation.kv.prefix_cache import PrefixCache
from serge.engine.generation.batching.sequence import Sequence
from serge.engine.generation.kv.shared_prefix import SharedPrefixes
from serge.engine.generation.stream import FinishReason
from serge.engine.metrics import ModelMetrics

log = logging.getLogger(__name__)


class KvReuse:
    """Where a reply's KV comes from and goes to (the scheduler's worker thread's alone)."""

    def __init__(self, forward: Forward, prefixes: PrefixCache, metrics: ModelMetrics,
                 leave: Callable[..., None]) -> None:
        self._forward = forward
        self._prefixes = prefixes
        self._m = metrics
        self._leave = leave  # the scheduler's (seq, reason, error): a reply whose KV could not be had ends alone
        self.shared = SharedPrefixes(forward, metrics)  # replies waiting for a running one's prompt prefix

    def start(self, seq: Sequence, running: list[Sequence]) -> None:
        """A slot is free: take what the prefix cache or a running reply has of this context. A failure here
        (llama.cpp refusing a cached conversation back) ends this reply alone."""
        try:
            cache = bool(self._prefixes.budget_bytes) and seq.images is None
            follower = self.shared.leader_for(seq, running, self._prefixes.reusable(seq.context()) if cache else 0)
            if follower is not None:  # a running reply prefills (or holds) more of this prompt: wait, then copy
                self.shared.follow(follower)
                return
            hit = self._prefixes.find(seq.context()) if cache else None
            if hit is None:
                seq.kv = self._forward.new_kv()
                return
        except Exception as exc:
            log.exception("could not start a reply")
            self._leave(seq, FinishReason.ERROR, failure_message(exc))
            return
        seq.kv, seq.prefilled = hit.kv, hit.length
        if not seq.resumed:
            seq.cached = min(hit.length, len(seq.prompt))
            seq.logits = seq.prompt_logits = hit.logits
        self._m.reused_tokens.inc(hit.length)
        if hit.logits is not None:
            self.share(seq)

    def share(self, seq: Sequence) -> None:
        """Choice 0's prompt is in: each other choice takes a copy of its KV and its next-token logits, so the
        prompt runs once for all n. A copy that fails (no llama.cpp slice) ends that choice alone."""
        followers, seq.followers = seq.followers, []
        for other in followers:
            try:
                other.kv = seq.kv.copy(len(seq.prompt))
            except Exception as exc:
                log.exception("could not copy a prompt's KV to another choice")
                self._leave(other, FinishReason.ERROR, failure_message(exc))
                continue
            other.prefilled = len(other.prompt)
            other.logits = other.prompt_logits = seq.prompt_logits

    def keep(self, seq: Sequence, worth_keeping: bool = True) -> None:
        """Its KV out of the batch: into the prefix cache, for the next turn or its own return, else given back."""
        kv, seq.kv = seq.kv, None
        if kv is None:
            return
        if worth_keeping and self._prefixes.budget_bytes and seq.images is None:
            self._prefixes.store(seq.prompt + seq.generated, kv, len(seq.prompt), seq.prompt_logits)
            self._m.prefix_cache_bytes.set(self._prefixes.nbytes)
        else:
            kv.release()
