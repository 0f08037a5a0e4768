"""Two systems side by side, their levels alternated: a ratio this machine's drift cannot bias.

`python -m bench` runs one system after the other, so a machine that slows down for a
few minutes (seen here: the same server 84 then 103 tok/s ten minutes apart) shifts a
ratio between them by as much as the gap being measured. Here both servers are up at
once and each level runs A, B, A, B, ... (`--pairs` pairs, the order flipped every
other pair), so each ratio compares runs a few seconds apart; the
table gives the median ratio of the pairs and their range.

    python -m bench.paired --systems serge-llama,llama-server --concurrency 1,8,16 --pairs 5

Writes bench/results/paired-<stamp>.{json,md}. Same workload as `python -m bench`
(the ~200-token prompt with a unique tag, 128 tokens, EOS ignored).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.systems import (BENCH_DIR, LABELS, MODEL_NAME, Config, cpu_name, default_installed_dir, default_model_dir,
                           installed_gguf, make_system)
from bench.workload import run_concurrent, summarize_level


def log(msg: str) -> None:
    print(f"[paired {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.paired", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", default="serge-llama,llama-server", help="two systems (names as `python -m bench`)")
    ap.add_argument("--concurrency", default="1,8,16")
    ap.add_argument("--pairs", type=int, default=5, help="A/B pairs per level")
    ap.add_argument("--single-reps", type=int, default=3, help="requests back to back in a 1-stream run")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out-dir", type=Path, default=BENCH_DIR / "results")
    args = ap.parse_args(argv)
    names = [s.strip() for s in args.systems.split(",")]
    if len(names) != 2:
        ap.error("--systems takes exactly two")
    levels = [int(c) for c in args.concurrency.split(",")]
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    cfg = Config(model_dir=default_model_dir(), threads=args.threads, max_tokens=args.max_tokens, gguf=installed_gguf(),
                 log_dir=Path(tempfile.mkdtemp(prefix=f"serge-paired-{stamp}-")),
                 serge_models_dir=default_installed_dir().parent, model_name=MODEL_NAME)
    run: dict[str, Any] = {"meta": {"started": datetime.now().isoformat(timespec="seconds"), "cpu": cpu_name(),
                                    "cpus": os.cpu_count(), "loadavg_start": [round(x, 2) for x in os.getloadavg()],
                                    "systems": names, "pairs": args.pairs, "threads": args.threads,
                                    "max_tokens": args.max_tokens},
                           "levels": []}
    systems = [make_system(n, cfg) for n in names]
    with contextlib.ExitStack() as stack:
        servers = []
        for name, system in zip(names, systems):
            system.info = {}
            system.check()
            servers.append(stack.enter_context(system.running()))
            log(f"{name}: ready at {servers[-1].base_url}")
        for srv, system in zip(servers, systems):  # warm-up: one full-length request each
            asyncio.run(run_concurrent(srv.base_url, system.body, 1, 1, args.max_tokens, 600))
        for c in levels:
            reps = args.single_reps if c == 1 else 1
            rows: list[list[float]] = [[], []]
            phases: list[list[dict[str, float]]] = [[], []]  # where the time went: first token, then each next one
            for pair in range(args.pairs):
                order = (0, 1) if pair % 2 == 0 else (1, 0)
                for i in order:
                    rs, t0, t1 = asyncio.run(run_concurrent(servers[i].base_url, systems[i].body, c, reps,
                                                            args.max_tokens, 600))
                    level = summarize_level(rs, t0, t1, c)
                    if level["errors"]:
                        raise SystemExit(f"{names[i]}: {level['errors']} failed requests at {c} streams: "
                                         f"{level['error_samples']}")
                    rows[i].append(level["agg_tok_s"])
                    phases[i].append({k: level[k] for k in ("ttft_p50", "itl_p50", "wall_s")})
                log(f"{c} streams, pair {pair + 1}: {rows[0][-1]:.1f} / {rows[1][-1]:.1f} tok/s "
                    f"= {rows[0][-1] / rows[1][-1]:.2f}x")
            ratios = [a / b for a, b in zip(*rows)]
            run["levels"].append({"concurrency": c, "tok_s": {names[0]: rows[0], names[1]: rows[1]}, "ratios": ratios,
                                  "median_ratio": statistics.median(ratios),
                                  "phases": {names[0]: phases[0], names[1]: phases[1]}})
    run["meta"]["finished"] = datetime.now().isoformat(timespec="seconds")
    md = markdown(run)
    print(md)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / f"paired-{stamp}.json").write_text(json.dumps(run, indent=1))
    (args.out_dir / f"paired-{stamp}.md").write_text(md)
    log(f"wrote {args.out_dir / f'paired-{stamp}'}.{{json,md}}")
    return 0


def markdown(run: dict) -> str:
    a, b = run["meta"]["systems"]
    lines = [f"Paired run {run['meta']['started']} · {run['meta']['cpu']} ({run['meta']['cpus']} CPUs), load at start "
             f"{run['meta']['loadavg_start']} · {run['meta']['pairs']} A/B pairs per level, "
             f"{run['meta']['threads']} threads for a system started with settings, {run['meta']['max_tokens']} tokens a reply", "",
             f"A: {LABELS[a]} · B: {LABELS[b]}", "",
             "| streams | A tok/s (median) | B tok/s (median) | A/B median | A/B range | pairs A ahead "
             "| first token p50, A / B (s) | next token p50, A / B (ms) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for lv in run["levels"]:
        ra, rb, ratios = lv["tok_s"][a], lv["tok_s"][b], lv["ratios"]
        lines.append(f"| {lv['concurrency']} | {statistics.median(ra):.1f} | {statistics.median(rb):.1f} | "
                     f"{lv['median_ratio']:.2f}x | {min(ratios):.2f}-{max(ratios):.2f}x | "
                     f"{sum(r > 1 for r in ratios)}/{len(ratios)} | {_phase(lv, a, 'ttft_p50', 1):.2f} / "
                     f"{_phase(lv, b, 'ttft_p50', 1):.2f} | {_phase(lv, a, 'itl_p50', 1000):.1f} / "
                     f"{_phase(lv, b, 'itl_p50', 1000):.1f} |")
    return "\n".join(lines) + "\n"


def _phase(level: dict, system: str, key: str, scale: float) -> float:
    """The median over the pairs of one system's per-run figure (nan in a results file from before phases)."""
    runs = level.get("phases", {}).get(system) or [{key: float("nan")}]
    return statistics.median(r[key] for r in runs) * scale


if __name__ == "__main__":
    raise SystemExit(main())
