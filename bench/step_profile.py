"""Where a llama.cpp decode step's time goes, in-process: the shares of a step, not a speed.

Loads the bundled GGUF on the llama.cpp engine (2 llama threads), submits N greedy streams of
M tokens (the bench's ~200-token prompt, each with its own tag), reads them all on one asyncio
loop as the web server does, and times the parts of every worker step with perf_counter:
llama_decode itself, the rest of `_run` (filling the batch), `_logits` (reading the rows),
sampling, the tokens' way to their streams (detokenizing, pushes), the loop wake-ups it
asked for, and the scheduler's bookkeeping (the rest of the step). It wraps functions from
outside (instrumentation only), so the same script measures any version of the code: run it
with `PYTHONPATH` at each checkout, interleaved, and compare shares and ratios, never figures
taken on a busy machine.

    PYTHONPATH=. OMP_NUM_THREADS=1 python -m bench.step_profile --streams 8 --tokens 128 --out step.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import defaultdict


def _timed(owner, name: str, totals: dict, key: str) -> None:
    """Replace owner.name by a wrapper adding its wall time to totals[key] (to totals["in prefill"] while a
    prompt chunk runs, so that the shares are a decode step's)."""
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            if key == "prefill" or not totals["prefilling"]:
                totals[key] += time.perf_counter() - start

    setattr(owner, name, wrapper)


def _prefill_marked(owner, totals: dict) -> None:
    """Mark the prompt chunks' passes (`Step._run_apart`, wrapped on the class: the step is made on the worker)."""
    inner = owner._run_apart

    def wrapper(*args, **kwargs):
        totals["prefilling"] = 1
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            totals["prefilling"] = 0
            totals["prefill"] += time.perf_counter() - start

    owner._run_apart = wrapper


class _Lib:
    """llama_cpp's module with llama_decode timed (LlamaForward calls it through `self._lc`)."""

    def __init__(self, lc, totals: dict) -> None:
        self._lc, self._totals = lc, totals

    def __getattr__(self, name):
        return getattr(self._lc, name)

    def llama_decode(self, ctx, batch):
        start = time.perf_counter()
        try:
            return self._lc.llama_decode(ctx, batch)
        finally:
            if not self._totals["prefilling"]:
                self._totals["llama_decode"] += time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2, help="rounds of N streams (the first warms up and is dropped)")
    ap.add_argument("--requantize", choices=["off", "auto"], default="off",
                    help="off (default): the bundled GGUF itself, the file llama-server runs; auto: what `make run` serves")
    ap.add_argument("--out")
    args = ap.parse_args(argv)

    from bench.workload import single_prompt_messages
    from serge.engine import Engine, SamplingParams
    from serge.engine.generation.batching import passes as passes_module
    from serge.engine.generation.batching import sequence as sequence_module
    from serge.engine.generation import stream as stream_module
    from serge.engine.llamacpp.forward import LlamaForward
    from serge.settings import Settings

    totals: dict[str, float] = defaultdict(float)  # seconds per part; "prefilling" is 1 inside _prefill
    settings = Settings(engine="llama.cpp", torch_threads=args.threads, max_running=args.streams,
                        llama_requantize=args.requantize)
    with Engine(settings) as engine:
        model = engine.model(None)
        sched = model.scheduler
        forward = sched.forward
        assert isinstance(forward, LlamaForward), "the bundled model must load on llama.cpp"
        forward._lc = _Lib(forward._lc, totals)
        _timed(forward, "_run", totals, "run")
        _timed(forward, "_logits", totals, "logits")
        _timed(sched, "_turn", totals, "step")
        _prefill_marked(passes_module.Step, totals)
        _timed(passes_module, "choose_all", totals, "sampling")
        _timed(sequence_module.Sequence, "accept", totals, "accept")
        _timed(stream_module.Stream, "_notify", totals, "notify")
        tok = model.tokenizer
        params = SamplingParams(temperature=0, max_new_tokens=args.tokens, ignore_eos=True).resolved(args.tokens)

        async def one(tag: int) -> int:
            text = tok.apply_chat_template(single_prompt_messages(tag), add_generation_prompt=True, tokenize=False)
            stream = sched.submit(tok.encode(text, add_special_tokens=False), params)
            count = 0
            async for delta in stream.adeltas():
                count += len(delta.text) > 0
            return count

        rows = []
        for rnd in range(args.rounds):
            totals.clear()
            loop = asyncio.new_event_loop()
            calls = [0]
            inner = loop.call_soon_threadsafe

            def counted(*a, calls=calls, inner=inner, **k):
                calls[0] += 1
                return inner(*a, **k)

            loop.call_soon_threadsafe = counted
            load = os.getloadavg()[0]
            start = time.perf_counter()

            async def all_streams(base: int) -> list[int]:
                return await asyncio.gather(*(one(base + i) for i in range(args.streams)))

            loop.run_until_complete(all_streams(rnd * 100))
            wall = time.perf_counter() - start
            loop.close()
            step = totals["step"] - totals["prefill"]  # the decode steps' time
            decode_only = totals["run"] - totals["llama_decode"]
            parts = {
                "llama_decode": totals["llama_decode"],
                "batch_fill (rest of _run)": decode_only,
                "logits read": totals["logits"],
                "sampling": totals["sampling"],
                "stream delivery (accept, incl. wake-ups)": totals["accept"],
                "  of which wake-up calls": totals["notify"],
                "scheduler bookkeeping (rest of step)": step - totals["run"] - totals["logits"] - totals["sampling"]
                - totals["accept"],
            }
            rows.append({"round": rnd, "wall_s": wall, "tokens_per_s": args.streams * args.tokens / wall,
                         "step_s": step, "prefill_s": totals["prefill"], "loop_wakeups": calls[0], "load_avg_1m": load,
                         "shares": {k: v / step for k, v in parts.items()}, "seconds": parts})
    kept = rows[1:] or rows
    for row in kept:
        print(f"round {row['round']}: {row['tokens_per_s']:.1f} tok/s, steps {row['step_s']:.2f} s of "
              f"{row['wall_s']:.2f} s wall (prefill {row['prefill_s']:.2f} s), {row['loop_wakeups']} loop wake-ups, load {row['load_avg_1m']:.2f}")
        for k, share in row["shares"].items():
            print(f"  {k:44s} {100 * share:6.2f} %  {1000 * row['seconds'][k]:9.1f} ms")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"streams": args.streams, "tokens": args.tokens, "threads": args.threads, "rounds": kept}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
