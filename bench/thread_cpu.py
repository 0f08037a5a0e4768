"""The CPU a streamed token costs a server beside its model's compute: per-thread accounting, not a speed.

On a machine with as many cores as compute threads, every other thread of the server (its event
loop, HTTP threads, sampling) runs on a core the model's threads need. This starts each system as
`python -m bench` does, sends one-stream requests of few and of many tokens (the bench's prompt,
greedy, EOS ignored), and reads every thread's CPU time from /proc before and after: the two
busiest threads are taken as the compute threads, the rest as the server's own work. The difference
between the long and the short requests, over the tokens they differ by, is that work's CPU a token,
free of what a request costs once (parsing, the chat template, the prefill). Linux only.

    python -m bench.thread_cpu --systems serge-llama,llama-server --requests 10 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from datetime import datetime
from pathlib import Path

from bench.systems import (BENCH_DIR, MODEL_NAME, Config, cpu_name, default_installed_dir, default_model_dir,
                           installed_gguf, make_system)
from bench.workload import run_concurrent


def thread_seconds(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of each thread of `pid`, by thread id."""
    ticks = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        out[tid] = (int(fields[11]) + int(fields[12])) / ticks
    return out


def other_seconds(pid: int, run) -> tuple[float, float]:
    """CPU seconds of the two busiest threads while `run()` runs, and of all the others."""
    before = thread_seconds(pid)
    run()
    after = thread_seconds(pid)
    spent = sorted(after[t] - before.get(t, 0.0) for t in after)
    return sum(spent[-2:]), sum(spent[:-2])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.thread_cpu", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", default="serge-llama,llama-server", help="names as `python -m bench` takes them")
    ap.add_argument("--requests", type=int, default=10, help="one-stream requests of each length a round")
    ap.add_argument("--short", type=int, default=8, help="tokens of a short request")
    ap.add_argument("--long", type=int, default=128, help="tokens of a long request")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out-dir", type=Path, default=BENCH_DIR / "results")
    args = ap.parse_args(argv)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    cfg = Config(model_dir=default_model_dir(), threads=args.threads, max_tokens=args.long, gguf=installed_gguf(),
                 log_dir=Path(tempfile.mkdtemp(prefix=f"serge-thread-cpu-{stamp}-")),
                 serge_models_dir=default_installed_dir().parent, model_name=MODEL_NAME)
    result = {"meta": {"started": datetime.now().isoformat(timespec="seconds"), "cpu": cpu_name(),
                       "cpus": os.cpu_count(), "loadavg_start": [round(x, 2) for x in os.getloadavg()],
                       **{k: getattr(args, k) for k in ("requests", "short", "long", "rounds", "threads")}},
              "systems": []}
    for name in [s.strip() for s in args.systems.split(",")]:
        system = make_system(name, cfg)
        system.info = {}
        system.check()
        with system.running() as server:
            def requests(tokens: int) -> None:
                asyncio.run(run_concurrent(server.base_url, system.body, 1, args.requests, tokens, 600))

            requests(args.long)  # warm-up
            per_token = []
            for _ in range(args.rounds):
                _, short = other_seconds(server.proc.pid, lambda: requests(args.short))
                _, long = other_seconds(server.proc.pid, lambda: requests(args.long))
                per_token.append((long - short) / (args.requests * (args.long - args.short)))
        result["systems"].append({"system": name, "ms_per_token": [1000 * x for x in per_token]})
        print(f"{name}: the threads beside the two busiest, "
              f"{' / '.join(f'{1000 * x:.3f}' for x in per_token)} ms of CPU a streamed token", flush=True)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / f"thread-cpu-{stamp}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
