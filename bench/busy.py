"""Serge on a busy machine: streams while other processes keep every core busy, thread count fixed against adapted.

    python -m bench.busy [--hogs 2] [--threads 2] [--streams 1,8] [--tokens 32]

Starts `--hogs` processes that spin on a core each (someone else's work), then for
each engine starts `serge serve` twice, `SERGE_ADAPT_THREADS=false` and `true`,
and runs the same streams against each (`generation.threads` is what differs).
Prints a table, writes JSON to bench/results/busy-<stamp>.json. Compare the two
rows of one engine as a ratio; the hogs make absolute figures meaningless.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

from bench.systems import BENCH_DIR, Config, default_installed_dir, default_model_dir, installed_gguf, make_system
from bench.workload import run_concurrent, summarize_level

SYSTEMS = {"transformers": "serge", "llama.cpp": "serge-llama"}


@contextlib.contextmanager
def hogs(n: int):
    """`n` processes spinning on a CPU each, stopped after."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def run_one(cfg: Config, system_name: str, adapt: bool, streams: list[int], tokens: int) -> list[dict]:
    os.environ["SERGE_ADAPT_THREADS"] = "true" if adapt else "false"  # the server's env is a copy of ours
    system = make_system(system_name, cfg)
    system.check()
    levels = []
    with system.running() as srv:
        asyncio.run(run_concurrent(srv.base_url, system.body, 1, 1, tokens, 600))  # warm-up
        for c in streams:
            rs, t0, t1 = asyncio.run(run_concurrent(srv.base_url, system.body, c, 1, tokens, 900))
            levels.append({"streams": c, **summarize_level(rs, t0, t1, c), "load_avg": os.getloadavg()[0]})
    return levels


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hogs", type=int, default=os.cpu_count() or 2, help="busy processes (default: one per CPU)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="SERGE_TORCH_THREADS, the most")
    p.add_argument("--streams", default="1,8")
    p.add_argument("--tokens", type=int, default=32, help="new tokens per reply")
    p.add_argument("--engines", default="transformers,llama.cpp")
    args = p.parse_args(argv)
    streams = [int(s) for s in args.streams.split(",")]
    cfg = Config(model_dir=default_model_dir(), threads=args.threads, max_tokens=args.tokens, gguf=installed_gguf(),
                 log_dir=Path(tempfile.mkdtemp(prefix="serge-busy-")), serge_models_dir=default_installed_dir().parent)
    rows = []
    with hogs(args.hogs):
        for engine in args.engines.split(","):
            for adapt in (False, True):
                for level in run_one(cfg, SYSTEMS[engine], adapt, streams, args.tokens):
                    rows.append({"engine": engine, "adapt_threads": adapt, **level})
                    print(f"[busy] {engine} adapt={adapt} {level['streams']} streams: "
                          f"{level['agg_tok_s']} tok/s", file=sys.stderr, flush=True)
    print(f"\n{args.hogs} busy processes on {os.cpu_count()} CPUs, SERGE_TORCH_THREADS={args.threads}, "
          f"{args.tokens} new tokens per reply\n")
    print("| engine | threads | streams | agg tok/s | TTFT p95 s | ITL p95 ms | load | adapted / fixed |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        fixed = next(f for f in rows if f["engine"] == r["engine"] and f["streams"] == r["streams"]
                     and not f["adapt_threads"])
        ratio = f"{r['agg_tok_s'] / fixed['agg_tok_s']:.2f}x" if r["adapt_threads"] and fixed["agg_tok_s"] else ""
        itl = r.get("itl_p95")
        print(f"| {r['engine']} | {'adapted' if r['adapt_threads'] else 'fixed'} | {r['streams']} | {r['agg_tok_s']:.1f} "
              f"| {r['ttft_p95']:.2f} | {itl * 1000 if itl else float('nan'):.0f} | {r['load_avg']:.1f} | {ratio} |")
    out = BENCH_DIR / "results" / f"busy-{datetime.now():%Y%m%d-%H%M%S}.json"
    out.write_text(json.dumps({"args": vars(args), "cpus": os.cpu_count(), "rows": rows}, indent=1))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
