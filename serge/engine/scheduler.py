"""The one worker that runs a model's generations.

Each loaded model gets one `Scheduler` and so one worker thread: no thread per
request. Requests wait in a queue and the worker runs them one after another,
each on its own KV cache, so no two requests can ever mix. Per-request state
(ids, cache, random generator, settings) lives on the `_Sequence`, never on the
shared model. Every sequence ends with `stream.finish()`, on every path.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from serge.engine.sampling import ResolvedSampling, choose_next
from serge.engine.stream import FinishReason, GenerationRecord, Stream, TextAssembler


@dataclass
class _Sequence:
    prompt: list[int]
    params: ResolvedSampling
    stream: Stream
    assembler: TextAssembler
    generated: list[int] = field(default_factory=list)
    started: float | None = None
    first_token: float | None = None


def _eos_ids(model, tokenizer) -> frozenset[int]:
    ids = model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


class Scheduler:
    def __init__(self, model, tokenizer, threads: int, name: str = "model") -> None:
        self._model = model
        self._tokenizer = tokenizer
        self._threads = threads
        self._eos = _eos_ids(model, tokenizer)
        self._pending: queue.SimpleQueue[_Sequence | None] = queue.SimpleQueue()
        self._worker = threading.Thread(target=self._run, name=f"serge-worker-{name}", daemon=True)
        self._worker.start()

    def submit(self, prompt: list[int], params: ResolvedSampling) -> Stream:
        stream = Stream()
        self._pending.put(_Sequence(prompt, params, stream, TextAssembler(self._tokenizer, params.stop)))
        return stream

    def close(self) -> None:
        """Finish what is queued as cancelled, then stop and join the worker."""
        self._pending.put(None)
        self._worker.join()

    # --- the worker ---------------------------------------------------------
    def _run(self) -> None:
        torch.set_num_threads(self._threads)  # per thread under OpenMP: set it where the work runs
        while (seq := self._pending.get()) is not None:
            self._generate(seq)
        while True:  # closing: whatever is still queued ends as cancelled
            try:
                seq = self._pending.get_nowait()
            except queue.Empty:
                return
            if seq is not None:
                seq.stream.cancel()
                self._generate(seq)

    def _generate(self, seq: _Sequence) -> None:
        seq.started = time.monotonic()
        reason, error = FinishReason.CANCELLED, None
        try:
            if not seq.stream.cancelled:
                reason = self._decode(seq)
        except Exception as exc:  # surfaced to the consumer through the record
            reason, error = FinishReason.ERROR, f"{type(exc).__name__}: {exc}"
        finally:
            if reason is not FinishReason.ERROR:
                seq.stream.push(seq.assembler.flush())
            seq.stream.finish(self._record(seq, reason, error))

    @torch.inference_mode()
    def _decode(self, seq: _Sequence) -> FinishReason:
        model, params = self._model, seq.params
        device = model.device
        generator = None if params.greedy else params.generator(device)
        needs_history = params.repetition_penalty != 1.0 or params.frequency_penalty or params.presence_penalty
        cache = DynamicCache(config=model.config)
        prompt = torch.tensor([seq.prompt], device=device)
        logits = model(input_ids=prompt, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
        while True:
            if needs_history:
                generated = torch.tensor(seq.generated, dtype=torch.long, device=device)
                seen = torch.cat([prompt[0], generated])
            else:
                generated = seen = prompt[0, :0]
            token = choose_next(logits, params, seen, generated, generator)
            if seq.first_token is None:
                seq.first_token = time.monotonic()
            if token in self._eos and not params.ignore_eos:
                return FinishReason.STOP
            seq.generated.append(token)
            seq.stream.push(seq.assembler.add(token))
            if seq.assembler.stopped:
                return FinishReason.STOP
            if len(seq.generated) >= params.max_new_tokens:
                return FinishReason.LENGTH
            if seq.stream.cancelled:
                return FinishReason.CANCELLED
            step = torch.tensor([[token]], device=device)
            logits = model(input_ids=step, cache=cache, use_cache=True).logits[0, -1]

    @staticmethod
    def _record(seq: _Sequence, reason: FinishReason, error: str | None) -> GenerationRecord:
        now = time.monotonic()
        return GenerationRecord(
            text=seq.assembler.text,
            finish_reason=reason,
            prompt_tokens=len(seq.prompt),
            completion_tokens=len(seq.generated),
            seed=seq.params.seed,
            queued_s=seq.started - seq.stream.created,
            ttft_s=None if seq.first_token is None else seq.first_token - seq.started,
            duration_s=now - seq.started,
            error=error,
        )
