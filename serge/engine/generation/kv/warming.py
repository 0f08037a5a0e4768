"""Prefilling a conversation's next prompt into the prefix cache while nobody waits: a chat being read.

A warm is a prompt with no reply: its tokens run through the model a chunk at a time, into a KV of its
own, and the KV goes to the prefix cache (`PrefixCache.store`, with no logits: the prompt a reply is
sent with is always longer), so the reply's prefill is only what was added after it. `Warming` keeps
the prompts to warm (one per party, the newest; at most `MOST_WARMS`, the oldest dropped) and runs
them for its `scheduler.Scheduler`, on its worker, one chunk per turn of the worker's loop and only
while no reply runs or waits: the scheduler asks it for a chunk (`step`) when it is idle, and stops it
(`stop`) before it admits a reply, keeping what was prefilled so far. A prompt whose tokens the cache
holds already costs nothing; what it already holds in part is taken as the start.

It knows nothing of chats, of who a party is, or of templates: the chat service chooses what to warm,
`local.LocalModel.warm` turns it into token ids; nor of sampling: a warm has no reader and no stream.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from serge.engine.generation.forward import KV, Forward, OutOfKV
from serge.engine.generation.kv.prefix_cache import PrefixCache
from serge.engine.metrics import ModelMetrics

log = logging.getLogger(__name__)

MOST_WARMS = 4  # prompts queued per model: a warm is a guess about the near future, so the newest win


@dataclass
class _Warm:
    prompt: list[int]
    party: str
    kv: KV | None = None
    held: int = 0  # tokens the prefix cache gave it at its start
    started: float = field(default_factory=time.monotonic)


class Warming:
    """A model's warms: queued by any thread under the scheduler's lock (`add`, `pending`, `next`), run on
    the scheduler's worker alone (`step`, `stop`, `drop`)."""

    def __init__(self, forward: Forward, prefixes: PrefixCache, chunk: int, metrics: ModelMetrics,
                 most: int = MOST_WARMS) -> None:
        self._forward = forward
        self._prefixes = prefixes
        self._chunk = chunk
        self._m = metrics
        self._most = most
        self._queue: OrderedDict[str, list[int]] = OrderedDict()  # party -> its newest prompt; oldest first
        self._job: _Warm | None = None  # the one being prefilled; the worker's alone

    # --- any thread, under the scheduler's lock ------------------------------------------
    def add(self, prompt: list[int], party: str) -> None:
        """Queue `prompt`, in place of the party's earlier one; past `most`, the oldest party's goes."""
        self._queue.pop(party, None)
        self._queue[party] = list(prompt)
        while len(self._queue) > self._most:
            self._queue.popitem(last=False)

    @property
    def pending(self) -> bool:
        """A warm is queued or under way: the worker has work while it is idle."""
        return bool(self._queue) or self._job is not None

    def next(self) -> bool:
        """The worker is idle: take the newest queued prompt unless one is under way; False when none is."""
        if self._job is None and self._queue:
            party, prompt = self._queue.popitem(last=True)
            self._job = _Warm(prompt, party)
        return self._job is not None

    def clear(self) -> None:
        """Forget what is queued (the model closes, or its prefix cache is emptied)."""
        self._queue.clear()

    # --- the worker --------------------------------------------------------------------
    def step(self) -> None:
        """One chunk of the warm under way (started from what the prefix cache holds of it); at its end,
        its KV goes to the prefix cache. A failure ends that warm alone: nothing waits on it."""
        job = self._job
        try:
            if job.kv is None and not self._begin(job):
                self._job = None
                return
            ids = job.prompt[job.kv.length : job.kv.length + self._chunk]
            self._forward.prefill(job.kv, ids)
            self._m.warmed_tokens.inc(len(ids))
        except OutOfKV:
            if not self._prefixes.evict_oldest():  # room for it is room the cache gives up, else none
                self.drop("no room in the KV memory")
            self._m.prefix_cache_bytes.set(self._prefixes.nbytes)
            return
        except Exception as exc:
            log.warning("warming a prompt of %d tokens failed: %s: %s", len(job.prompt), type(exc).__name__, exc)
            self.drop()
            return
        if job.kv.length >= len(job.prompt):
            self._keep(job, "warmed")

    def stop(self) -> None:
        """A reply is coming: the warm under way ends here, what it prefilled kept for the reply to take."""
        job = self._job
        if job is not None and job.kv is not None and job.kv.length > job.held:
            self._keep(job, "stopped for a reply after")
        else:
            self.drop()

    def drop(self, why: str = "") -> None:
        """End the warm under way and free its KV, keeping nothing."""
        job, self._job = self._job, None
        if job is not None and job.kv is not None:
            job.kv.release()
        if why and job is not None:
            log.info("a warm of %d tokens was given up: %s", len(job.prompt), why)

    def _begin(self, job: _Warm) -> bool:
        """Its KV: what the prefix cache holds of its prompt, or a new one; False when the cache holds it all."""
        if self._prefixes.held(job.prompt) >= len(job.prompt):
            return False
        hit = self._prefixes.find(job.prompt)
        job.kv, job.held = (hit.kv, hit.length) if hit is not None else (self._forward.new_kv(), 0)
        return True

    def _keep(self, job: _Warm, what: str) -> None:
        self._job = None
        tokens = job.kv.length - job.held
        self._prefixes.store(job.prompt[: job.kv.length], job.kv, job.kv.length, None)
        self._m.prefix_cache_bytes.set(self._prefixes.nbytes)
        log.info("%s %d tokens of a prompt of %d (%d held already) in %.2f s", what, tokens, len(job.prompt),
                 job.held, time.monotonic() - job.started)
