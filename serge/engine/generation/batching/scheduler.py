"""Many generations sharing one model: continuous batching behind a bounded queue.

Each loaded model gets one `Scheduler` and so one worker thread, not a thread per request.
`submit` queues a request (`admission.Waiting`: bounded, whole requests in order). At every
step the worker admits what fits in `max_running`, runs one forward pass over every sequence
being decoded, prefills about `prefill_chunk` prompt tokens while others decode (every waiting
prompt when none do), and samples every row at once, each with its own settings and generator
(that step is `passes.Step`, given the batch and the verbs that change it; the worker holds its
readers' wake-ups to one per event loop a pass), on as many threads as the machine has free (`threads.Threads`).
A sequence that finishes, stops, fails or is cancelled leaves the batch in the same step. What a
starting reply needs of its prompt is taken, where it is already computed, from the prefix cache,
a running reply or its choice 0, and what a leaving one computed is kept there (`kv_reuse`). Where
the forward hands its KV over as bytes (llama.cpp's), the prefix cache's long conversations are kept
on disk when the model unloads and taken back at its next load (`kv_store`).

It runs any forward (`forward.Forward`: transformers' `BatchForward`, llama.cpp's
`LlamaForward`, a stand-in in tests), so sampling, stop strings, prefix reuse, admission,
metrics, grammars and logprobs are one piece of code for every local engine. A forward whose
KV is a fixed pool (the paged one) raises `OutOfKV` when full: the prefix cache gives back its
oldest entries, then the youngest running reply waits (its KV given back, its tokens run again
when a reply ends): it waits, never fails, for want of room.

The slots are shared fairly between parties (who asked, opaque: `submit`'s `party`): the queue gives
free slots to the party holding the fewest (`admission.Waiting`), and a party over its share gives
its youngest replies back, as a reply waits for KV room, when another waits under its (`_give_way`).

While no reply runs or waits, the worker prefills warms (`warm`, `warming.Warming`: a chat's next
prompt, into the prefix cache), a chunk a turn, and stops one the moment a reply comes.

Every sequence ends with `stream.finish()`, on every path.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from collections import Counter


from serge.engine.generation.batching.admission import EngineBusy, SchedulerLimits, Waiting
from serge.engine.generation.forward import Forward, OutOfKV
from serge.engine.generation.constraints.grammar import Vocabulary
from serge.engine.generation.batching.host_sampling import HOST, generator
from serge.engine.generation.kv.kv_reuse import KvReuse
from serge.engine.generation.kv.kv_store import KvStore
from serge.engine.generation.kv.prefix_cache import PrefixCache
from serge.engine.generation.batching.passes import Batch, Step, failure_message
from serge.engine.generation.sampling import SamplingParams
from serge.engine.generation.constraints.schemas import InvalidRequest
from serge.engine.generation.batching.sequence import ReplyReader, Sequence
from serge.engine.generation.stream import FinishReason, GenerationError, Stream
from serge.engine.generation.prompting.thinking import Thinking
from serge.engine.generation.batching.threads import Threads
from serge.engine.generation.batching.wakeups import Wakeups
from serge.engine.generation.kv.warming import Warming
from serge.engine.metrics import EngineMetrics
from serge.engine.openmp import end_team

log = logging.getLogger(__name__)


class Scheduler:
    def __init__(
        self,
        forward: Forward,
        tokenizer,
        eos: frozenset[int],
        threads: int,
        name: str = "model",
        limits: SchedulerLimits | None = None,
        metrics: EngineMetrics | None = None,
        prefix_cache_bytes: int | None = None,
        adapt_threads: bool = True,
        kv_store: KvStore | None = None,
    ) -> None:
        limits = limits or SchedulerLimits()
        self.name = name
        self.forward = forward
        self._device = forward.device
        self._tokenizer = tokenizer
        self._most_threads = threads
        self._adapt_threads = adapt_threads
        self._eos = eos
        self.vocabulary = Vocabulary(tokenizer, eos)  # grammars compiled for this model, token bytes
        self.max_running = limits.running_for(self._device)
        self.max_queue = limits.max_queue
        self._chunk = limits.prefill_chunk
        budget = limits.prefix_cache_mb * 2**20
        self._prefixes = PrefixCache(budget if prefix_cache_bytes is None else min(budget, prefix_cache_bytes))
        self._kv_store = kv_store if self._prefixes.budget_bytes else None  # the prefix cache across restarts
        self.metrics = metrics if metrics is not None else EngineMetrics()
        self._m = self.metrics.model(name)
        self._lock = threading.Condition()
        self._waiting = Waiting(limits.queue_timeout_s)  # under _lock
        self._active = 0  # sequences admitted and not finished; under _lock
        self._closing = False
        self._forget = False  # drop the prefix cache before the next admission
        self._hold = False  # a reply was made to wait for KV room: admit none until one ends
        self._running: list[Sequence] = []  # the worker's alone
        self._mean_duration = 10.0  # seconds per generation, for Retry-After
        self._wakeups = Wakeups()  # the readers' event loops, woken once each per step
        self._reuse = KvReuse(forward, self._prefixes, self._m, self._leave)  # the worker's alone
        self._warming = Warming(forward, self._prefixes, self._chunk, self._m)  # queued under _lock
        self._worker = threading.Thread(target=self._run, name=f"serge-worker-{name}", daemon=True)
        self._worker.start()

    def submit(self, prompt: list[int], params: SamplingParams, grammar: str | None = None,
               reader: ReplyReader | None = None, grammar_param: str = "response_format",
               finish_json: bool = False, thinking: Thinking | None = None, n: int = 1,
               images: dict | None = None, party: str = "") -> Stream:
        """Queue a generation of `n` choices (one stream); raises `EngineBusy` when every slot and the queue
        are full, InvalidRequest when n is more than run at once. Choice i samples with `params.for_choice(i)`.

        `finish_json`: every reply the grammar allows is JSON, so near the end of its budget the
        reply is steered to close what is open (see `Sequence.choose`).

        `grammar` (llguidance's Lark) constrains the reply; it is compiled here, once per
        distinct text, so a bad one raises `GrammarError` (naming `grammar_param`) now.

        `images`: a vision prompt's pixel inputs (opaque here): the whole prompt runs in one prefill pass
        that carries them (its image tokens cannot be split from their features), and its KV is never
        taken from or given to the prefix cache (its placeholder ids are the same for any image).

        `party`: who asks (opaque); the slots are shared fairly between parties (see `_give_way`).
        """
        if not prompt:
            raise ValueError("a prompt needs at least one token")
        if not 1 <= n <= self.max_running:
            raise InvalidRequest(f"n={n}: this model runs at most {self.max_running} replies at once "
                                 f"(SERGE_MAX_RUNNING), so a request may ask for 1 to {self.max_running} choices", "n")
        if params.logprobs is not None:
            self.vocabulary.prepare()  # token bytes: a second's work, here rather than on the worker
        stream = Stream(n, self._wakeups)
        stream.max_new_tokens = params.max_new_tokens  # resolved: the most a choice may take (a quota's budget)
        group = Sequence.choices(prompt, params, stream, self._tokenizer, self._eos, self.vocabulary,
                                 (grammar, grammar_param) if grammar is not None else None, reader, finish_json,
                                 thinking, n, images)
        for seq in group:
            seq.party = party
        with self._lock:
            if self._closing:
                raise GenerationError(f"the model {self.name!r} is being unloaded; try again")
            try:
                stream.queue_position = self._waiting.add(group, self._active, self.max_running, self.max_queue,
                                                          self._mean_duration)
            except EngineBusy:
                self._m.rejected.inc()
                raise
            self._m.queued.set(len(self._waiting))
            self._lock.notify()
        return stream

    def warm(self, prompt: list[int], party: str = "") -> bool:
        """Prefill `prompt` into the prefix cache while no reply runs or waits, a chunk at a time, and stop
        at the next chunk the moment one comes (`warming.Warming`); queued in place of `party`'s earlier
        warm. False when there is no prefix cache to keep it in, or the model is closing."""
        if not prompt or not self._prefixes.budget_bytes:
            return False
        with self._lock:
            if self._closing:
                return False
            self._warming.add(prompt, party)
            self._lock.notify()
        return True

    @property
    def pending(self) -> int:
        """Sequences running or queued: the registry never unloads a model that has any."""
        with self._lock:
            return self._active + self._waiting.sequences

    def close(self) -> None:
        """End every queued and running generation as cancelled, then stop and join the worker."""
        with self._lock:
            self._closing = True
            self._lock.notify()
        self._worker.join()

    def forget_prefixes(self) -> None:
        """Empty the prefix cache before any later request starts (it refills as generations finish)."""
        with self._lock:
            self._forget = True

    # --- the worker ---------------------------------------------------------
    def _run(self) -> None:
        if self._device is not HOST:  # a host forward samples in numpy: no torch to set
            import torch  # extra: transformers

            torch.set_num_threads(self._most_threads)  # per thread under OpenMP: set it where the work runs
        self.forward.prepare()  # measured with this thread's kernels, before any request waits on it
        if self._kv_store is not None:  # before any request looks in the prefix cache
            self._kv_store.load(self._prefixes)
            self._m.prefix_cache_bytes.set(self._prefixes.nbytes)
        counts = self.forward.thread_counts(self._most_threads) if self._adapt_threads else [self._most_threads]
        threads = Threads(counts, self.forward.set_threads, self._m.threads.set)
        self._step = Step(self.forward, Batch(self._running, self._leave, self._make_room, self._reuse.share),
                          self._chunk, self._m, threads, self._wakeups)  # the worker's alone
        while True:
            with self._lock:
                while not self._closing and not self._waiting and not self._running and not self._warming.pending:
                    end_team()  # idle, its OpenMP helpers would count against every other team's (`openmp`)
                    self._lock.wait()
                if self._closing:
                    break
                if self._forget:
                    self._forget = False
                    self._warming.drop()
                    self._prefixes.clear()
                    self._m.prefix_cache_bytes.set(0)
                idle = not self._waiting and not self._running
                warming = idle and self._warming.next()
                admitted, expired = self._admit() if not idle else ([], [])
            if warming:  # nobody waits: a chunk of a warm, and back to look again
                self._warming.step()
                continue
            self._warming.stop()  # a reply comes: before it looks in the prefix cache (`_start`)
            with self._wakeups.held():
                self._turn(admitted, expired)
        with self._lock:
            self._warming.clear()
            leftover = self._waiting.drain()
        for seq in leftover + list(self._running):
            seq.stream.cancel()
            if seq in self._running:
                self._leave(seq, FinishReason.CANCELLED)
            else:
                self._finish(seq, FinishReason.CANCELLED)
        self._step.observe_gaps()
        self._warming.drop()
        if self._kv_store is not None:
            self._kv_store.save(self._prefixes)
        self._prefixes.clear()
        self.forward.close()  # on this thread, like every pass before it

    def _turn(self, admitted: list[Sequence], expired: list[tuple[Sequence, FinishReason, str | None]]) -> None:
        """One step of the worker, its readers woken once at its end: what was admitted starts, then a pass."""
        for seq, reason, error in expired:
            self._finish(seq, reason, error, busy=True)
        self._running.extend(admitted)
        for seq in admitted:
            if seq in self._running:  # not a choice that its choice 0's failed start has ended
                self._start(seq)
        if len(self._reuse.shared):  # before the pass: a follower whose leader holds its part copies it, runs the rest
            self._reuse.shared.hand_over(self._running, self._start, self._leave)
        try:
            self._step()
        except Exception as exc:  # a bug, not a bad request: fail what runs, keep serving
            log.exception("scheduler step failed")
            for seq in list(self._running):
                self._leave(seq, FinishReason.ERROR, failure_message(exc))

    def _admit(self) -> tuple[list[Sequence], list[tuple[Sequence, FinishReason, str | None]]]:
        """Under the lock: move waiting requests into free slots (none while a reply waits for KV room)."""
        if not self._waiting:  # the common step: nothing to admit, expire or give way to
            return [], []
        if not self._hold:
            self._give_way()
        free = 0 if self._hold else self.max_running - len(self._running)
        admitted, expired = self._waiting.admit(free, time.monotonic(), Counter(s.party for s in self._running))
        self._active = len(self._running) + len(admitted)
        self._m.queued.set(len(self._waiting))
        self._m.running.set(self._active)
        return admitted, expired

    def _start(self, seq: Sequence) -> None:
        """A slot is free: its clock and generator start, and its KV comes from where it can (`kv_reuse`)."""
        seq.stream.queue_position = None
        if seq.started is None:  # not when it comes back after waiting for KV room: its generator goes on
            seq.started = time.monotonic()
            if not seq.params.greedy:
                seq.generator = generator(seq.params.seed, self._device)
            if seq.choice:  # its prompt comes from choice 0 (`KvReuse.share`)
                return
            self._m.queue_wait.observe(seq.started - seq.stream.created)
            self._m.prompt_tokens.inc(len(seq.prompt))
        self._reuse.start(seq, self._running)

    def _make_room(self, exc: OutOfKV, failing: Sequence | None = None) -> bool:
        """The KV pool is full: give back the prefix cache's oldest entry or, with none left, make the
        youngest running reply wait. False (and `failing`, or every reply, ended) when the one reply
        left does not fit alone: a pool smaller than one reply's window."""
        if self._prefixes.evict_oldest():
            self._m.prefix_cache_bytes.set(self._prefixes.nbytes)
            return True
        holders = [s for s in self._running if s.kv is not None]
        if len(holders) < 2:
            for seq in [failing] if failing is not None else list(self._running):
                self._leave(seq, FinishReason.ERROR, f"this reply needs more KV memory than the model has ({exc})")
            return False
        group = self._set_aside(max(holders, key=lambda s: s.started), keep=False)
        log.info("KV pool full: a reply waits for room, %d tokens to run again", group[0].context_length)
        self._m.preempted.inc()
        with self._lock:
            self._waiting.put_back(group)
            self._active -= len(group)
            self._hold = True
        return True

    def _leave(self, seq: Sequence, reason: FinishReason, error: str | None = None) -> None:
        """Out of the batch, now: its KV goes to the prefix cache (or is freed), its stream ends. Choice 0
        ending before its prompt is in ends the choices waiting for it, with its error."""
        if seq not in self._running:  # a choice that its choice 0 has ended already
            return
        self._running.remove(seq)
        stranded, seq.followers = seq.followers, []
        self._reuse.keep(seq, reason is not FinishReason.ERROR)  # before finish(): the next turn may come at once
        with self._lock:
            self._active -= 1
            self._hold = False  # its room is free: a reply made to wait may come back
            self._m.running.set(self._active)
        self._finish(seq, reason, error)
        for other in stranded:
            self._leave(other, reason, error)

    def _finish(self, seq: Sequence, reason: FinishReason, error: str | None = None, busy: bool = False) -> None:
        if reason is not FinishReason.ERROR:
            seq.flush()
        record = seq.record(reason, error)
        if busy:  # it waited out the queue's timeout: the server is busy, nothing failed
            record = replace(record, busy=True)
        if seq.started is not None:
            self._mean_duration = 0.8 * self._mean_duration + 0.2 * record.duration_s
        self._m.finished(reason.value)
        seq.stream.finish(record, seq.choice)

    # --- a fair share of the slots (`admission.Waiting` decides; this does) ----------------------
    def _give_way(self) -> None:
        """Under the lock, before admission: while a party waits under its share of the slots and none is
        free, the parties over theirs give back the slots it needs, their youngest replies first (with the
        choices still waiting for one's prompt). Each waits at the front of its party's queue, its KV kept
        in the prefix cache, and comes back with its generator and reply so far, as after waiting for KV
        room: it goes on as if it had not waited. So a party's n choices or many requests hold every slot
        only while no one else asks."""
        holding = Counter(s.party for s in self._running)
        given = self._waiting.over_share(holding, self.max_running, self.max_running - len(self._running))
        for party, slots in given.items():
            youngest = sorted((s for s in self._running if s.party == party and s.kv is not None),
                              key=lambda s: s.started, reverse=True)
            for seq in youngest:
                if slots <= 0:
                    break
                group = self._set_aside(seq, keep=True)
                self._waiting.put_back(group)
                slots -= len(group)
            log.info("fair share: %r gave back %d slots to a party under its share", party, given[party] - slots)

    def _set_aside(self, seq: Sequence, keep: bool) -> list[Sequence]:
        """Out of the batch to wait in the queue (the caller puts it back), with the choices still waiting for its
        prompt; its KV kept in the prefix cache (`keep`), else given back, to be run again when it comes back."""
        group, seq.followers = [seq, *seq.followers], []
        for one in group:
            self._running.remove(one)
            if keep:
                self._reuse.keep(one)
            one.set_aside()
        return group
