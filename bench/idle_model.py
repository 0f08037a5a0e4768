"""A transformers model's decode speed alone, and with a second one loaded and idle.

`python -m bench.idle_model` loads the bundled model twice under two names (hard links of the
installed files in a folder of its own), both on the transformers engine, in this process.
Each round streams a greedy reply of `--max-tokens` (EOS ignored) from the first alone, then
loads the second and runs one reply on it (its worker's torch passes), then streams the first's
reply again while the second sits idle, then unloads the second. Each reply's next-token p50.
An idle worker whose OpenMP team stays alive puts the process's OpenMP threads over the CPUs,
and libgomp then puts every team's barriers to sleep (`serge/engine/openmp.py`).

Writes bench/results/idle-model-<stamp>.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path

from bench.systems import BENCH_DIR, cpu_name, default_installed_dir
from serge.engine import ChatRequest, Engine, Message, SamplingParams
from serge.settings import Settings

NAMES = ("first", "second")


def library(folder: Path) -> Path:
    """The installed bundled model under each of NAMES (hard links: no copy of the weights)."""
    source = default_installed_dir()
    for name in NAMES:
        shutil.copytree(source, folder / name, copy_function=os.link)
        manifest = json.loads((source / "serge.json").read_text())
        (folder / name / "serge.json").unlink()
        (folder / name / "serge.json").write_text(json.dumps({**manifest, "name": name}))
    return folder


def next_token_ms(engine: Engine, params: SamplingParams) -> float:
    times = [time.perf_counter() for _ in engine.chat(NAMES[0], ChatRequest(
        [Message("user", "Tell me a long story about the sea.")], params))]
    return statistics.median(b - a for a, b in zip(times, times[1:])) * 1000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.idle_model", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out-dir", type=Path, default=BENCH_DIR / "results")
    args = ap.parse_args(argv)
    params = SamplingParams(temperature=0, max_new_tokens=args.max_tokens, ignore_eos=True)
    rows: dict[str, list[float]] = {"alone": [], "second idle": []}
    with tempfile.TemporaryDirectory(prefix="serge-bench-idle-") as tmp:
        settings = Settings(data_dir=Path(tmp) / "data", models_dir=library(Path(tmp)), engine="transformers",
                            torch_threads=args.threads, max_loaded_models=2, default_model=NAMES[0])
        with Engine(settings) as engine:
            next_token_ms(engine, params)  # the first load and reply's one-off work
            for _ in range(args.rounds):
                rows["alone"].append(next_token_ms(engine, params))
                list(engine.chat(NAMES[1], ChatRequest([Message("user", "Hello.")], params)))
                rows["second idle"].append(next_token_ms(engine, params))
                engine.unload(NAMES[1])
    alone, idle = (statistics.median(rows[k]) for k in rows)
    print("| transformers engine | next token p50 (ms) |\n|---|---|")
    print(f"| alone | {alone:.2f} |\n| a second model loaded, idle | {idle:.2f} |")
    print(f"second idle / alone: {idle / alone:.3f}x the next-token time")
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out_dir / f"idle-model-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": {"started": stamp, "cpu": cpu_name(), "cpus": os.cpu_count(),
                                        "threads": args.threads, "max_tokens": args.max_tokens},
                               "replies": rows, "ratio": idle / alone}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
