"""A chat's decode speed before and after the server has made embeddings.

`python -m bench.after_embeddings` starts Serge as `make run` starts it (`--system`), streams
one-stream replies (the bench's prompt, greedy, `--max-tokens`, EOS ignored) and reads each
one's next-token time, then asks `/v1/embeddings` for `--embeddings` batches of 16 texts
(which loads the bundled embedding model), then streams the same replies again. Beside each
reply's pace: the voluntary context switches of the server's threads per token. A compute
thread that sleeps mid-pass shows here: libgomp's barriers spin while the process's OpenMP
threads fit the CPUs and sleep once they do not (`serge/engine/openmp.py`).

Writes bench/results/after-embeddings-<stamp>.json and prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path

import httpx

from bench.systems import BENCH_DIR, MODEL_NAME, Config, cpu_name, default_installed_dir, default_model_dir, make_system
from bench.workload import next_tag, single_prompt_messages

EMBEDDER = "all-minilm-l6-v2"


def switches(pid: int) -> int:
    """Voluntary context switches of every thread of `pid` so far."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            status = (task / "status").read_text()
            total += int(status.split("\nvoluntary_ctxt_switches:")[1].split()[0])
    return total


def reply(base_url: str, pid: int, max_tokens: int) -> dict[str, float]:
    """One streamed reply: its median next-token time and its threads' voluntary switches a token."""
    body = {"model": MODEL_NAME, "messages": single_prompt_messages(next_tag()), "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "ignore_eos": True}
    before, times = switches(pid), []
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and '"content"' in line:
                times.append(time.perf_counter())
    gaps = [b - a for a, b in zip(times, times[1:])]
    return {"itl_ms": statistics.median(gaps) * 1000, "switches_per_token": (switches(pid) - before) / len(times)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.after_embeddings", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--system", default="serge-default", help="the Serge to start (bench/systems.py's names)")
    ap.add_argument("--replies", type=int, default=4, help="replies before and after (default 4)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--embeddings", type=int, default=3, help="/v1/embeddings requests between (default 3)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out-dir", type=Path, default=BENCH_DIR / "results")
    args = ap.parse_args(argv)
    cfg = Config(model_dir=default_model_dir().resolve(), threads=args.threads, max_tokens=args.max_tokens, gguf=None,
                 log_dir=Path(tempfile.mkdtemp(prefix="serge-bench-embed-")),
                 serge_models_dir=default_installed_dir().parent)
    system = make_system(args.system, cfg)
    system.check()
    rows: dict[str, list[dict[str, float]]] = {}
    with system.running() as server:
        pid = server.proc.pid
        reply(server.base_url, pid, 16)  # the first reply's one-off work
        rows["before"] = [reply(server.base_url, pid, args.max_tokens) for _ in range(args.replies)]
        for _ in range(args.embeddings):
            r = httpx.post(f"{server.base_url}/v1/embeddings", timeout=600,
                           json={"model": EMBEDDER, "input": [f"text {i}: " + "words to embed " * 40 for i in range(16)]})
            r.raise_for_status()
        rows["after"] = [reply(server.base_url, pid, args.max_tokens) for _ in range(args.replies)]
    summary = {phase: {key: statistics.median(row[key] for row in rows[phase]) for key in rows[phase][0]}
               for phase in rows}
    print(f"| {args.system} | next token p50 (ms) | voluntary switches a token |\n|---|---|---|")
    for phase, s in summary.items():
        print(f"| {phase} embeddings | {s['itl_ms']:.2f} | {s['switches_per_token']:.1f} |")
    print(f"after / before: {summary['after']['itl_ms'] / summary['before']['itl_ms']:.3f}x the next-token time")
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out_dir / f"after-embeddings-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": {"started": stamp, "cpu": cpu_name(), "cpus": os.cpu_count(), "system": args.system,
                                        "max_tokens": args.max_tokens, "embeddings": args.embeddings,
                                        "info": system.info},
                               "replies": rows, "summary": summary}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
