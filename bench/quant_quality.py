"""What re-quantizing the bundled GGUF costs and gives: perplexity against the original, and llama.cpp's speed.

Makes Q8_0 and Q4_0 copies of the installed bundled GGUF (Q4_1) with llama.cpp's own quantize API, in a
temporary folder, then for each file: its perplexity over the repo's own prose (as `bench.kv_quality`, 6,000
tokens, f16 KV with flash attention) and, in-process on one llama.cpp thread, the CPU time of a 219-token
prefill and of a decode step of 1 and of 8 streams (CPU time, not wall time, so that a busy machine inflates
every file alike; compare the ratios). `serge.engine.llamacpp.gguf.requantize` serves a layout by default only
where its perplexity cost is negligible.

    python -m bench.quant_quality     # a table on stdout, JSON in bench/results/quant-quality-<date>.json
"""

from __future__ import annotations

import json
import math
import os
import platform
import tempfile
import time
from pathlib import Path

from bench.kv_quality import REPO, nll
from bench.systems import installed_gguf

LAYOUTS = {"Q8_0": 7, "Q4_0": 2}  # enum llama_ftype


def requantized(source: Path, folder: Path) -> dict[str, Path]:
    import llama_cpp as lc

    lc.llama_backend_init()
    out = {}
    for name, ftype in LAYOUTS.items():
        params = lc.llama_model_quantize_default_params()
        params.ftype, params.allow_requantize, params.nthread = ftype, True, 2
        target = folder / f"{source.stem}.{name}.gguf"
        if lc.llama_model_quantize(str(source).encode(), str(target).encode(), params) != 0:
            raise RuntimeError(f"llama.cpp could not make {name}")
        out[name] = target
    return out


def speed(gguf: Path, reps: int = 3) -> dict[str, float]:
    """Least CPU time (ms) over `reps` of a 219-token prefill and of a decode step of 1 and of 8 streams."""
    from serge.engine.llamacpp.forward import LlamaForward
    from serge.engine.llamacpp.memory import kv_type

    forward = LlamaForward(str(gguf), 1, max_batch=256, kv=kv_type("f16"))
    forward.size(8, 2048)
    forward.prepare()
    prompt = [(i * 37) % 40000 + 100 for i in range(219)]
    best = {"prefill_219": math.inf, "decode_1": math.inf, "decode_8": math.inf}
    clock = time.thread_time  # one llama.cpp thread: its work runs on this thread
    try:
        for _ in range(reps):
            kv = forward.new_kv()
            t = clock()
            forward.prefill(kv, prompt)
            best["prefill_219"] = min(best["prefill_219"], clock() - t)
            t = clock()
            for i in range(32):
                forward.decode([kv], [100 + i])
            best["decode_1"] = min(best["decode_1"], (clock() - t) / 32)
            kvs = [kv] + [forward.new_kv() for _ in range(7)]
            for other in kvs[1:]:
                forward.prefill(other, prompt[:200])
            t = clock()
            for i in range(24):
                forward.decode(kvs, [100 + i] * 8)
            best["decode_8"] = min(best["decode_8"], (clock() - t) / 24)
            for one in kvs:
                one.release()
    finally:
        forward.close()
    return {k: round(v * 1000, 2) for k, v in best.items()}


def main() -> None:
    source = installed_gguf()
    pages = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")), "bench/README.md"]
    text = "".join((REPO / p).read_text() for p in pages)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        files = {"Q4_1 (bundled)": source, **requantized(source, Path(folder))}
        print("| layout | MB | perplexity | vs bundled | prefill 219 ms | decode 1 ms | decode 8 ms |\n"
              "|---|---:|---:|---:|---:|---:|---:|")
        for name, gguf in files.items():
            mean, _ = nll(gguf, text, 1, 1, True)
            row = {"layout": name, "mb": round(gguf.stat().st_size / 2**20, 1), "perplexity": math.exp(mean),
                   **speed(gguf)}
            row["vs_bundled"] = row["perplexity"] / rows[0]["perplexity"] if rows else 1.0
            rows.append(row)
            print(f"| {name} | {row['mb']:.0f} | {row['perplexity']:.3f} | {row['vs_bundled']:.4f} | "
                  f"{row['prefill_219']:.0f} | {row['decode_1']:.1f} | {row['decode_8']:.1f} |", flush=True)
    out = REPO / "bench" / "results" / f"quant-quality-{time.strftime('%Y-%m-%d')}.json"
    meta = {"gguf": str(source), "cpu": platform.processor() or platform.machine(), "load_avg": os.getloadavg(),
            "timing": "CPU time on one llama.cpp thread, least of 3"}
    out.write_text(json.dumps({**meta, "rows": rows}, indent=2) + "\n")
    print(f"json: {out}")


if __name__ == "__main__":
    main()
